// IEEE binary16 and bfloat16 conversions with round-to-nearest-even, as
// PyTorch's c10::Half and c10::BFloat16 do them.
//
// Thread-safety: pure functions.
#ifndef KILN_SUPPORT_HALF_H_
#define KILN_SUPPORT_HALF_H_

#include <cstdint>
#include <cstring>

namespace kiln {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    // Subnormal: value = mant * 2^-24.
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                       // below 2^-14: subnormal
    // Add 0.5 (as a float) to shift the mantissa into place; the FPU rounds
    // to nearest even for us.
    float shifted = BitsToFloat(abs) + 0.5f;
    return sign | static_cast<uint16_t>(FloatBits(shifted) - 0x3f000000u);
  }
  uint32_t mant_odd = (abs >> 13) & 1;
  uint32_t rounded = abs + 0xc8000fffu + mant_odd;  // rebias exp, round RNE
  return sign | static_cast<uint16_t>(rounded >> 13);
}

inline float BFloat16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

// n bfloat16 values widened to float32 (exact) into out.
inline void BFloat16ToFloat(const uint16_t* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(in[i]);
}

inline uint16_t FloatToBFloat16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // canonical nan
  u += 0x7fffu + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace kiln

#endif  // KILN_SUPPORT_HALF_H_
