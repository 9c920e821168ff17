#include "compiler/compiler_identity.h"

#include "absl/strings/str_cat.h"
#include "kiln/compiler_identity.inc"

namespace kiln {

const char* CompilerIdentity() { return KILN_COMPILER_IDENTITY; }

Sha256Digest StoreKey(const Sha256Digest& request_key,
                      absl::string_view compiler_identity) {
  Sha256Hasher hasher;
  hasher.Update("kiln-store-key-v1");
  hasher.Update(absl::string_view(
      reinterpret_cast<const char*>(request_key.data()), request_key.size()));
  // Length-prefixed: no identity is a prefix of another's encoding.
  hasher.Update(absl::StrCat(compiler_identity.size(), ":"));
  hasher.Update(compiler_identity);
  return hasher.Finish();
}

}  // namespace kiln
