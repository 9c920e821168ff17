// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11; Random123's philox4x32_R with R = 10): the counter-based
// generator of Kiln's random ops. The reference evaluator calls this
// function; the code generators emit the same rounds inline
// (compiler/kernel_emitter.cc), so compiled kernels and the reference draw
// the same bits.
//
// Kiln's stream: element `index` of a random op with key `seed` and stream
// number `offset` is Philox4x32-10 of the counter (lo32(index), hi32(index),
// lo32(offset), hi32(offset)) under the key (lo32(seed), hi32(seed)); the op
// uses word 0 (uniform, bernoulli, dropout) or words 0 and 1 (normal).
//
// Thread-safety: pure functions.
#ifndef KILN_SUPPORT_PHILOX_H_
#define KILN_SUPPORT_PHILOX_H_

#include <array>
#include <cstdint>

namespace kiln {

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
inline constexpr int kPhiloxRounds = 10;

// The four 32-bit words of Philox4x32-10 for (seed, offset, index).
inline std::array<uint32_t, 4> Philox4x32(uint64_t seed, uint64_t offset,
                                          uint64_t index) {
  uint32_t c0 = static_cast<uint32_t>(index);
  uint32_t c1 = static_cast<uint32_t>(index >> 32);
  uint32_t c2 = static_cast<uint32_t>(offset);
  uint32_t c3 = static_cast<uint32_t>(offset >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed);
  uint32_t k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < kPhiloxRounds; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return {c0, c1, c2, c3};
}

}  // namespace kiln

#endif  // KILN_SUPPORT_PHILOX_H_
