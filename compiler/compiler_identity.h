// The compiler's identity and the key kilnd stores an artifact under
// (DESIGN.md, decision 11).
//
// A client computes the *request key* (graph/guard_key.h: graph, input
// metadata, target, code-changing options, key format), which does not
// depend on the client's build. kilnd stores and looks up an artifact under
// the *store key*: the request key together with the identity of the
// compiler that serves it, so a changed compiler never serves an artifact
// an older one built, while clients of any build keep hitting.
//
// Thread-safety: pure functions.
#ifndef KILN_COMPILER_COMPILER_IDENTITY_H_
#define KILN_COMPILER_COMPILER_IDENTITY_H_

#include "absl/strings/string_view.h"
#include "support/sha256.h"

namespace kiln {

// The compiler identity baked in at build time: 64 hex characters, a
// SHA-256 over compiler/, graph/ and proto/ sources and the LLVM and CUDA
// versions (cmake/CompilerIdentity.cmake).
const char* CompilerIdentity();

// SHA-256 over a format tag, the 32-byte request key and the identity.
Sha256Digest StoreKey(const Sha256Digest& request_key,
                      absl::string_view compiler_identity);

}  // namespace kiln

#endif  // KILN_COMPILER_COMPILER_IDENTITY_H_
