// qmoe: scalar conversions between fp32 and the narrow types (fp16, bf16, e4m3, e8m0, e2m1).
// Host and device share these definitions so both sides decode every code to the same float.
// All float -> narrow conversions round to nearest, ties to even.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define QMOE_HD __host__ __device__ __forceinline__
#else
#define QMOE_HD inline
#endif

// Keeps a loop rolled in device code: cold loops (one lane over the k picks, say) unrolled with
// remainders multiply a kernel's code, and a kernel that runs once per layer call fetches all of
// it into cold instruction caches. Nothing on the host.
#if defined(__CUDA_ARCH__)
#define QMOE_NO_UNROLL _Pragma("unroll 1")
#else
#define QMOE_NO_UNROLL
#endif

namespace qmoe {
namespace num {

QMOE_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
QMOE_HD float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// ---- IEEE binary16 ----
QMOE_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in fp32
    float v = static_cast<float>(man) * 5.9604644775390625e-08f;
    return bits_f32(f32_bits(v) | sign);
  }
  if (exp == 31) return bits_f32(sign | 0x7F800000u | (man << 13));  // inf / nan
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

QMOE_HD uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t au = u & 0x7FFFFFFFu;
  if (au >= 0x7F800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7C00u | (au > 0x7F800000u ? 0x200u : 0u));
  }
  if (au >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (au < 0x38800000u) {               // below the smallest normal 2^-14: subnormal result
    if (au < 0x33000000u) return sign;  // < 2^-25 rounds to zero (2^-25 itself ties to 0)
    const uint32_t exp = au >> 23;
    const uint32_t man = (au & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // value = man * 2^(exp-150); result unit 2^-24
    uint32_t r = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = au + 0xC8000000u;   // rebias exponent 127 -> 15
  r += 0xFFFu + ((r >> 13) & 1u);  // round to nearest even on the 13 dropped bits
  return static_cast<uint16_t>(sign | (r >> 13));
}

// ---- bfloat16 ----
QMOE_HD float bf16_to_f32(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

QMOE_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet nan
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// ---- float8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no inf; 0x7F/0xFF nan; max 448 ----
QMOE_HD float e4m3_to_f32(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t exp = (c >> 3) & 0xFu;
  const uint32_t man = c & 0x7u;
  if (exp == 15 && man == 7) return bits_f32(0x7FC00000u | sign);
  if (exp == 0) {  // subnormal: man * 2^-9
    float v = static_cast<float>(man) * 0.001953125f;
    return bits_f32(f32_bits(v) | sign);
  }
  return bits_f32(sign | ((exp + 120u) << 23) | (man << 20));
}

// Saturating: finite values beyond 448 become +-448 (the behaviour of cvt.satfinite); nan -> 0x7F.
QMOE_HD uint8_t f32_to_e4m3(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t au = u & 0x7FFFFFFFu;
  if (au > 0x7F800000u) return 0x7F;
  if (au >= 0x43E80000u) return static_cast<uint8_t>(sign | 0x7E);  // >= 464 rounds past 448
  if (au < 0x3C800000u) {                // below 2^-6: subnormal, unit 2^-9
    if (au <= 0x3A000000u) return sign;  // <= 2^-11 (half the smallest subnormal) -> 0
    const uint32_t exp = au >> 23;
    const uint32_t man = (au & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 141u - exp;  // value = man * 2^(exp-150), unit 2^-9
    uint32_t r = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint8_t>(sign | r);  // r == 8 is the smallest normal, encoded the same way
  }
  uint32_t r = au - (120u << 23);
  r += 0x7FFFFu + ((r >> 20) & 1u);
  uint32_t code = r >> 20;
  if (code > 0x7E) code = 0x7E;  // 448 < |f| < 464 rounds down to 448
  return static_cast<uint8_t>(sign | code);
}

// ---- float8 e8m0: 2^(c - 127), 0xFF nan ----
QMOE_HD float e8m0_to_f32(uint8_t c) {
  if (c == 0xFF) return bits_f32(0x7FC00000u);
  if (c == 0) return bits_f32(0x00400000u);  // 2^-127, an fp32 subnormal
  return bits_f32(static_cast<uint32_t>(c) << 23);
}

// ---- fp4 e2m1: bit 3 sign, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 ----
QMOE_HD float e2m1_to_f32(uint8_t c) {
  // 2 * magnitude is 0,1,2,3,4,6,8,12: exact, and the same on every target.
  const uint32_t m = c & 7u;
  const float twice = static_cast<float>(m < 4 ? m : (m == 4 ? 4 : m == 5 ? 6 : m == 6 ? 8 : 12));
  const float v = twice * 0.5f;
  return (c & 8u) ? -v : v;
}

// Nearest E2M1 code, ties to the even code; saturates at +-6; nan -> +0 is not representable, so
// callers must not pass nan (the quantizers never do).
QMOE_HD uint8_t f32_to_e2m1(float f) {
  const uint8_t sign = (f32_bits(f) >> 28) & 8u;
  const float a = f < 0 ? -f : f;
  // Midpoints between consecutive magnitudes; at a tie pick the even code.
  uint8_t m;
  if (a < 0.25f)
    m = 0;
  else if (a == 0.25f)
    m = 0;
  else if (a < 0.75f)
    m = 1;
  else if (a == 0.75f)
    m = 2;
  else if (a < 1.25f)
    m = 2;
  else if (a == 1.25f)
    m = 2;
  else if (a < 1.75f)
    m = 3;
  else if (a == 1.75f)
    m = 4;
  else if (a < 2.5f)
    m = 4;
  else if (a == 2.5f)
    m = 4;
  else if (a < 3.5f)
    m = 5;
  else if (a == 3.5f)
    m = 6;
  else if (a < 5.0f)
    m = 6;
  else if (a == 5.0f)
    m = 6;
  else
    m = 7;
  return static_cast<uint8_t>(sign | m);
}

}  // namespace num
}  // namespace qmoe
