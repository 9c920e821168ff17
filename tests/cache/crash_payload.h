// The artifacts the crash writer puts, as functions of (round, index), so the
// parent test can recompute and check every one it reads back.
#ifndef KILN_TESTS_CACHE_CRASH_PAYLOAD_H_
#define KILN_TESTS_CACHE_CRASH_PAYLOAD_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "support/sha256.h"

namespace kiln::crash_test {

inline Sha256Digest Key(int round, int i) {
  return Sha256(absl::StrCat("crash/", round, "/", i));
}

// Mostly small (inline) values, every 5th a blob-sized one.
inline size_t SizeOf(int i) {
  return i % 5 == 0 ? 20000 + 997 * (i % 100) : 100 + 61 * (i % 64);
}

// Bytes derived from the key by a xorshift stream.
inline std::string Payload(const Sha256Digest& key, size_t size) {
  uint64_t state = 0;
  for (int i = 0; i < 8; ++i) state = (state << 8) | key[i];
  state |= 1;
  std::string payload(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    if (i % 8 == 0) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
    }
    payload[i] = static_cast<char>(state >> (8 * (i % 8)));
  }
  return payload;
}

}  // namespace kiln::crash_test

#endif  // KILN_TESTS_CACHE_CRASH_PAYLOAD_H_
