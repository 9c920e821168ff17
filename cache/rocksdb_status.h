// Maps RocksDB and errno failures to absl::Status codes for the artifact
// store (see the error table in artifact_store.h). Internal to cache/.
#ifndef KILN_CACHE_ROCKSDB_STATUS_H_
#define KILN_CACHE_ROCKSDB_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "rocksdb/status.h"

namespace kiln::cache_internal {

// `what` says what was being done; the message is
// "<what> (data dir <dir>): <RocksDB's message>".
absl::Status FromRocksDb(const rocksdb::Status& status, absl::string_view what,
                         absl::string_view data_dir);

// Whether `status` is RocksDB failing to take the LOCK file of a database that
// another DB instance (in this or another process) holds.
bool IsLockHeld(const rocksdb::Status& status);

// The code for a failed system call's errno.
absl::StatusCode ErrnoToCode(int error_number);

// "<what>: <strerror>" with the code from ErrnoToCode.
absl::Status ErrnoError(int error_number, absl::string_view what);

}  // namespace kiln::cache_internal

#endif  // KILN_CACHE_ROCKSDB_STATUS_H_
