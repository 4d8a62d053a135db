// The generic path's activation kernels (cuda/layer/stages.h: launch_activation) on their own:
//   - every FC1 row order (interleaved, concatenated, separate FC3, the GluRows bands), row
//     dtype (f32, bf16), output (f32, bf16, f16, FP8 rows), gated and plain activations, with
//     and without biases and the routing weight scaling the input, I and ld multiples of 8 and
//     of 4 only (the rows kernel's bound), against a host computation;
//   - the rows kernel (a warp per 128 outputs) and the block-per-route kernel that takes the rows
//     it cannot (misaligned ones) give the same bits: results do not depend on the grid;
//   - FP8 rows' group scales are the groups' amax / 448; f16 FC1 rows are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/act_quant.h"
#include "core/numeric.h"
#include "cpu/activation.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/layer/stages.h"
#include "gpu_test_util.h"
#include "test_util.h"

namespace qmoe::test {
namespace {

struct ActCase {
  std::string name;
  ActivationSpec act;
  bool banded = false;
  DType h_dtype = DType::kF32;
  DType out_dtype = DType::kBF16;
  bool fp8 = false;  // FP8 rows instead of out_dtype
  bool fc1_bias = false, fc3_bias = false;
  bool scale_input = false;
  int64_t inter = 264, ld = 272;
};

ActivationSpec swiglu(GluLayout glu, float alpha = 1.0f, float limit = INFINITY, float beta = 0) {
  ActivationSpec a;
  a.kind = Activation::kSwiGlu;
  a.glu = glu;
  a.alpha = alpha;
  a.limit = limit;
  a.beta = beta;
  return a;
}

ActivationSpec plain(Activation kind) {
  ActivationSpec a;
  a.kind = kind;
  return a;
}

// The CPU backend's activation of one (gate, linear) pair, or of one value for plain kinds.
double host_act(const ActivationSpec& a, double g, double l) {
  const float gf = static_cast<float>(g), lf = static_cast<float>(l);
  if (!a.gated()) return cpu::scalar_activation(a.kind, gf);
  return a.kind == Activation::kSwiGlu ? cpu::swiglu(a, gf, lf) : cpu::gelu_tanh(gf) * lf;
}

// Rounds host values to the dtype the kernel reads them in.
std::vector<uint8_t> as_dtype(std::vector<float>* v, DType t) {
  std::vector<uint8_t> bytes;
  if (t == DType::kF32) {
    bytes.resize(v->size() * 4);
    std::memcpy(bytes.data(), v->data(), bytes.size());
    return bytes;
  }
  bytes.resize(v->size() * 2);
  for (size_t i = 0; i < v->size(); ++i) {
    const uint16_t b = num::f32_to_bf16((*v)[i]);
    (*v)[i] = num::bf16_to_f32(b);
    std::memcpy(bytes.data() + 2 * i, &b, 2);
  }
  return bytes;
}

float out_value(const std::vector<uint8_t>& out, DType t, int64_t i) {
  if (t == DType::kF32) {
    float f;
    std::memcpy(&f, out.data() + 4 * i, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, out.data() + 2 * i, 2);
  return t == DType::kBF16 ? num::bf16_to_f32(b) : num::f16_to_f32(b);
}

// One case: the host's values, then each launch's bytes. `misaligned`: the rows placed one
// element past a 16-byte boundary, so the block-per-route kernel runs.
class ActivationRun {
 public:
  ActivationRun(const ActCase& c, uint64_t seed) : c_(c) {
    const int64_t I = c.inter;
    const bool gated = c.act.gated();
    const bool separate = gated && c.act.glu == GluLayout::kSeparateFc3;
    fc1_rows_ = gated && !separate ? 2 * I : I;
    ldh_ = fc1_rows_ + 8;  // a stride past the row
    std::mt19937_64 rng(seed);
    h_ = gaussian(static_cast<size_t>(kRoutes * ldh_), seed, 2.0f);
    h_bytes_ = as_dtype(&h_, c.h_dtype);
    if (separate) {
      h3_ = gaussian(static_cast<size_t>(kRoutes * (I + 8)), seed + 1, 2.0f);
      h3_bytes_ = as_dtype(&h3_, c.h_dtype);
    }
    if (c.fc1_bias) b1_ = gaussian(static_cast<size_t>(kExperts * fc1_rows_), seed + 2, 0.5f);
    if (c.fc3_bias) b3_ = gaussian(static_cast<size_t>(kExperts * I), seed + 3, 0.5f);
    perm_.resize(kRoutes);
    std::iota(perm_.begin(), perm_.end(), 0);
    std::shuffle(perm_.begin(), perm_.end(), rng);
    ids_.resize(kRoutes);
    for (auto& id : ids_) id = static_cast<int32_t>(rng() % kExperts);
    weights_ = gaussian(static_cast<size_t>(kRoutes), seed + 4, 0.7f);
  }

  // The host's activation of route position p, output i (0 past I).
  double want(int64_t p, int64_t i) const {
    const int64_t I = c_.inter;
    if (i >= I) return 0.0;
    const int32_t r = perm_[static_cast<size_t>(p)];
    const int64_t e = ids_[static_cast<size_t>(r)];
    const double s = c_.scale_input ? weights_[static_cast<size_t>(r)] : 1.0;
    auto h = [&](int64_t col) {
      return static_cast<double>(h_[static_cast<size_t>(p * ldh_ + col)]);
    };
    auto b1 = [&](int64_t row) {
      return c_.fc1_bias ? static_cast<double>(b1_[static_cast<size_t>(e * fc1_rows_ + row)]) : 0;
    };
    if (!c_.act.gated()) return host_act(c_.act, s * h(i) + b1(i), 0);
    double g, l, bg = 0, bl = 0;
    if (c_.banded) {
      g = h(cuda::glu_band_gate_row(i)), l = h(cuda::glu_band_gate_row(i) + 8);
    } else if (c_.act.glu == GluLayout::kInterleaved) {
      g = h(2 * i), l = h(2 * i + 1), bg = b1(2 * i), bl = b1(2 * i + 1);
    } else if (c_.act.glu == GluLayout::kConcatenated) {
      g = h(i), l = h(I + i), bg = b1(i), bl = b1(I + i);
    } else {
      g = h(i), l = h3_[static_cast<size_t>(p * (I + 8) + i)], bg = b1(i);
      bl = c_.fc3_bias ? b3_[static_cast<size_t>(e * I + i)] : 0;
    }
    return host_act(c_.act, s * g + bg, s * l + bl);
  }

  // Launches into poisoned outputs: `out` gets the output rows (or the FP8 codes), `scales` the
  // FP8 scales.
  ::testing::AssertionResult launch(bool misaligned, std::vector<uint8_t>* out,
                                    std::vector<float>* scales) {
    const int64_t I = c_.inter;
    const int shift = misaligned ? 1 : 0;  // elements
    const size_t esz = c_.h_dtype == DType::kF32 ? 4 : 2;
    std::vector<uint8_t> hb(h_bytes_.size() + 16, 0);
    std::memcpy(hb.data() + shift * esz, h_bytes_.data(), h_bytes_.size());
    GpuBuffer dh, dh3, db1, db3, dperm, dids, dw, dout, dscales;
    auto ok = dh.upload(hb);
    if (ok && !h3_bytes_.empty()) {
      std::vector<uint8_t> h3b(h3_bytes_.size() + 16, 0);
      std::memcpy(h3b.data() + shift * esz, h3_bytes_.data(), h3_bytes_.size());
      ok = dh3.upload(h3b);
    }
    if (ok && !b1_.empty()) ok = db1.upload(b1_);
    if (ok && !b3_.empty()) ok = db3.upload(b3_);
    if (ok) ok = dperm.upload(perm_);
    if (ok) ok = dids.upload(ids_);
    if (ok) ok = dw.upload(weights_);
    const size_t out_bytes = c_.fp8
                                 ? static_cast<size_t>(kRoutes * I)
                                 : static_cast<size_t>(kRoutes * c_.ld) * dtype_size(c_.out_dtype);
    if (ok) ok = dout.allocate(out_bytes, 0xCD);
    if (ok && c_.fp8) ok = dscales.allocate(static_cast<size_t>(kRoutes * I / 128) * 4, 0xCD);
    if (!ok) return ok;
    cuda::ActivationArgs a;
    a.act = c_.act;
    a.inter = I;
    a.h = static_cast<const char*>(dh.get()) + shift * esz;
    a.ldh = ldh_;
    a.h_dtype = c_.h_dtype;
    a.banded = c_.banded;
    if (dh3.get()) {
      a.h3 = static_cast<const char*>(dh3.get()) + shift * esz;
      a.ldh3 = I + 8;
      a.h3_dtype = c_.h_dtype;
    }
    a.fc1_bias = db1.get();
    a.fc3_bias = db3.get();
    a.bias_dtype = DType::kF32;
    a.fc1_rows = fc1_rows_;
    a.scale_input = c_.scale_input;
    a.permuted_route = dperm.as<const int32_t>();
    a.expert_ids = dids.as<const int32_t>();
    a.weights = dw.as<const float>();
    a.routes = kRoutes;
    if (c_.fp8) {
      a.ld = I;
      a.out_codes = dout.as<uint8_t>();
      a.out_scales = dscales.as<float>();
    } else {
      a.out = dout.get();
      a.ld = c_.ld;
      a.out_dtype = c_.out_dtype;
    }
    const Status st = cuda::launch_activation(a, nullptr);
    if (!st.is_ok()) return ::testing::AssertionFailure() << st.to_string();
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(e);
    ok = dout.download(out);
    if (ok && c_.fp8) ok = dscales.download(scales);
    return ok;
  }

  static constexpr int64_t kRoutes = 37;  // not a multiple of a block's eight warps
  static constexpr int64_t kExperts = 3;

 private:
  ActCase c_;
  int64_t fc1_rows_ = 0, ldh_ = 0;
  std::vector<float> h_, h3_, b1_, b3_, weights_;
  std::vector<uint8_t> h_bytes_, h3_bytes_;
  std::vector<int32_t> perm_, ids_;
};

std::vector<ActCase> cases() {
  std::vector<ActCase> v;
  ActCase c;
  c.name = "swiglu interleaved, biases, scaled input, bf16 rows -> FP8 rows";
  c.act = swiglu(GluLayout::kInterleaved, 1.702f, 7.0f, 1.0f);
  c.h_dtype = DType::kBF16, c.fp8 = true, c.fc1_bias = true, c.scale_input = true;
  c.inter = 384;
  v.push_back(c);
  c = ActCase{};
  c.name = "swiglu concatenated, biases, f32 rows -> bf16, padded ld";
  c.act = swiglu(GluLayout::kConcatenated);
  c.fc1_bias = true;
  v.push_back(c);
  c = ActCase{};
  c.name = "swiglu separate FC3, both biases, bf16 rows -> f32";
  c.act = swiglu(GluLayout::kSeparateFc3);
  c.h_dtype = DType::kBF16, c.out_dtype = DType::kF32, c.fc1_bias = c.fc3_bias = true;
  v.push_back(c);
  c = ActCase{};
  c.name = "swiglu GluRows bands, bf16 rows -> bf16";
  c.act = swiglu(GluLayout::kConcatenated);
  c.banded = true, c.h_dtype = DType::kBF16;
  v.push_back(c);
  c = ActCase{};
  c.name = "geglu interleaved, bias, f32 rows -> f16, scaled input";
  c.act = plain(Activation::kGeGlu);
  c.act.glu = GluLayout::kInterleaved;
  c.out_dtype = DType::kF16, c.fc1_bias = true, c.scale_input = true;
  v.push_back(c);
  c = ActCase{};  // the rows kernel's bound: I and ld multiples of 4, not of 8
  c.name = "swiglu concatenated, biases, bf16 rows -> bf16, I and ld 4 mod 8";
  c.act = swiglu(GluLayout::kConcatenated);
  c.h_dtype = DType::kBF16, c.fc1_bias = true, c.inter = 260, c.ld = 268;
  v.push_back(c);
  c = ActCase{};
  c.name = "swiglu interleaved, bias, f32 rows -> f32, I and ld 4 mod 8";
  c.act = swiglu(GluLayout::kInterleaved);
  c.out_dtype = DType::kF32, c.fc1_bias = true, c.inter = 132, c.ld = 132;
  v.push_back(c);
  c = ActCase{};
  c.name = "gelu, bias, bf16 rows -> FP8 rows";
  c.act = plain(Activation::kGelu);
  c.h_dtype = DType::kBF16, c.fp8 = true, c.fc1_bias = true, c.inter = 256;
  v.push_back(c);
  return v;
}

TEST(GpuActivation, BothKernelsGiveTheSameBitsAndTheHostsValues) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  for (const ActCase& c : cases()) {
    SCOPED_TRACE(c.name);
    ActivationRun run(c, seed);
    std::vector<uint8_t> out, out_block;
    std::vector<float> sc;
    ASSERT_TRUE(run.launch(false, &out, &sc));
    if (!c.fp8) {  // FP8 rows need aligned rows; the block-per-route kernel takes the rest
      std::vector<float> unused;
      ASSERT_TRUE(run.launch(true, &out_block, &unused));
      EXPECT_EQ(out_block, out) << "the rows and the block-per-route kernels differ";
    }
    const int64_t R = ActivationRun::kRoutes;
    const int64_t cols = c.fp8 ? c.inter : c.ld;
    for (int64_t p = 0; p < R; ++p) {
      // FP8 rows: each group's scale is its amax / 448 (act_quant.h) within fp32 rounding.
      for (int64_t g = 0; c.fp8 && g < c.inter / 128; ++g) {
        double amax = 0;
        for (int64_t i = g * 128; i < (g + 1) * 128; ++i)
          amax = std::max(amax, std::fabs(run.want(p, i)));
        const double s = sc[static_cast<size_t>(p * (c.inter / 128) + g)];
        ASSERT_NEAR(s, amax / 448.0, 1e-5 * amax / 448.0 + 1e-30)
            << "route position " << p << " group " << g;
      }
      for (int64_t i = 0; i < cols; ++i) {
        const double want = run.want(p, i);
        double got, tol;
        if (c.fp8) {
          const float s = sc[static_cast<size_t>(p * (c.inter / 128) + i / 128)];
          got = num::e4m3_to_f32(out[static_cast<size_t>(p * c.inter + i)]) * s;
          tol = 0.0626 * std::fabs(want) + s * 0.001 + 1e-5;
        } else {
          got = out_value(out, c.out_dtype, p * c.ld + i);
          const double u = c.out_dtype == DType::kF32    ? 1e-5
                           : c.out_dtype == DType::kBF16 ? 1.0 / 256
                                                         : 1.0 / 1024;
          tol = u * std::fabs(want) + 1e-5;
        }
        ASSERT_LE(std::fabs(got - want), tol) << "route position " << p << " output " << i;
      }
    }
  }
}

// FC1 rows of a dtype no GEMM writes (f16) are refused, the argument named, before anything runs
// (no device needed: the check comes first).
TEST(GpuActivation, F16Fc1RowsAreRefused) {
  for (int which = 0; which < 2; ++which) {
    cuda::ActivationArgs a;
    a.act = swiglu(GluLayout::kSeparateFc3);
    a.inter = 128;
    a.ld = 128;
    a.routes = 1;
    (which == 0 ? a.h_dtype : a.h3_dtype) = DType::kF16;
    const Status st = cuda::launch_activation(a, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(which == 0 ? "h_dtype" : "h3_dtype"), std::string::npos)
        << st.to_string();
  }
}

}  // namespace
}  // namespace qmoe::test
