#include "cache/rocksdb_status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kiln::cache_internal {
namespace {

// RocksDB's IOError carries the errno only as text (and kNoSpace for ENOSPC),
// so the kind of I/O failure is read from the message.
absl::StatusCode IoErrorCode(const rocksdb::Status& status,
                             const std::string& text) {
  if (status.subcode() == rocksdb::Status::kNoSpace ||
      status.subcode() == rocksdb::Status::kSpaceLimit ||
      absl::StrContains(text, std::strerror(ENOSPC)) ||
      absl::StrContains(text, std::strerror(EDQUOT)) ||
      absl::StrContains(text, std::strerror(EFBIG))) {
    return absl::StatusCode::kResourceExhausted;
  }
  if (absl::StrContains(text, std::strerror(EACCES)) ||
      absl::StrContains(text, std::strerror(EPERM))) {
    return absl::StatusCode::kPermissionDenied;
  }
  if (absl::StrContains(text, std::strerror(EROFS))) {
    return absl::StatusCode::kFailedPrecondition;
  }
  if (status.subcode() == rocksdb::Status::kPathNotFound) {
    return absl::StatusCode::kNotFound;
  }
  return absl::StatusCode::kUnavailable;
}

}  // namespace

absl::Status FromRocksDb(const rocksdb::Status& status, absl::string_view what,
                         absl::string_view data_dir) {
  if (status.ok()) return absl::OkStatus();
  const std::string text = status.ToString();
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (status.code()) {
    case rocksdb::Status::kOk:
      return absl::OkStatus();
    case rocksdb::Status::kNotFound:
      code = absl::StatusCode::kNotFound;
      break;
    case rocksdb::Status::kCorruption:
      code = absl::StatusCode::kDataLoss;
      break;
    case rocksdb::Status::kNotSupported:
      code = absl::StatusCode::kFailedPrecondition;
      break;
    case rocksdb::Status::kInvalidArgument:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case rocksdb::Status::kIOError:
      code = IoErrorCode(status, text);
      break;
    case rocksdb::Status::kBusy:
    case rocksdb::Status::kTimedOut:
    case rocksdb::Status::kTryAgain:
    case rocksdb::Status::kIncomplete:
    case rocksdb::Status::kShutdownInProgress:
      code = absl::StatusCode::kUnavailable;
      break;
    case rocksdb::Status::kAborted:
      code = absl::StatusCode::kAborted;
      break;
    default:
      code = absl::StatusCode::kInternal;
      break;
  }
  return absl::Status(code,
                      absl::StrCat(what, " (data dir ", data_dir, "): ", text));
}

bool IsLockHeld(const rocksdb::Status& status) {
  if (!status.IsIOError()) return false;
  const std::string text = status.ToString();
  // The messages of PosixFileSystem::LockFile for a lock held in this process
  // and in another one.
  return absl::StrContains(text, "lock hold by current process") ||
         (absl::StrContains(text, "While lock file") &&
          (absl::StrContains(text, std::strerror(EAGAIN)) ||
           absl::StrContains(text, std::strerror(EACCES))));
}

absl::StatusCode ErrnoToCode(int error_number) {
  switch (error_number) {
    case EACCES:
    case EPERM:
      return absl::StatusCode::kPermissionDenied;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::StatusCode::kResourceExhausted;
    case ENOENT:
      return absl::StatusCode::kNotFound;
    case EROFS:
    case ENOTDIR:
    case EEXIST:
      return absl::StatusCode::kFailedPrecondition;
    case EINVAL:
    case ENAMETOOLONG:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kUnavailable;
  }
}

absl::Status ErrnoError(int error_number, absl::string_view what) {
  return absl::Status(ErrnoToCode(error_number),
                      absl::StrCat(what, ": ", std::strerror(error_number)));
}

}  // namespace kiln::cache_internal
