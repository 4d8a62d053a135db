// The decode kernel's launcher (see decode_gemv.h; the kernel is decode_kernel.cuh): argument
// checks, the launch geometry, and the turn from runtime widths into template arguments.
#include <algorithm>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/decode/decode_gemv.h"
#include "cuda/decode/decode_launch.h"

namespace qmoe::cuda {

using namespace decode_detail;

namespace {

// The geometry of an FC with rows_cap staged rows (the caller sets rows_cap afterwards).
DecodeGeometry geometry(const MmaPackShape& s, int block_size) {
  DecodeGeometry g;
  const int chunk_k = 16 * s.steps_per_chunk;
  g.kpad = static_cast<int>(s.chunks) * chunk_k;
  g.ld = g.kpad + 8;
  g.nblk = block_size ? static_cast<int>(s.k / block_size) : 1;
  g.nblk_pad = block_size ? (g.kpad + block_size - 1) / block_size : 1;
  g.shift = 30;
  if (block_size) {
    g.shift = 0;
    while ((1 << g.shift) < block_size) ++g.shift;
  }
  if (s.bits == 3) {
    g.spb = -1;
  } else if (block_size == 0 || block_size >= chunk_k) {
    g.spb = 0;
  } else {
    g.spb = block_size / 16;
  }
  g.rows_cap = 1;
  return g;
}

}  // namespace

Status check_decode_args(const DecodeFcArgs& a) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kF16) {
    return Status::invalid(std::string("decode dtype: expected bf16 or f16, got ") +
                           dtype_name(a.dtype));
  }
  if (a.packed == nullptr || a.scales == nullptr || a.x == nullptr || a.out == nullptr ||
      a.touched == nullptr || a.n_touched == nullptr || a.offsets == nullptr ||
      (a.by_token && a.permuted_route == nullptr) ||
      (a.scale_input && (a.weights == nullptr || a.permuted_route == nullptr))) {
    return Status::invalid("decode: null weight, scale, activation, output or schedule pointer");
  }
  if (a.shape.k % 16 != 0 || a.ldx % 8 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0) {
    return Status::invalid(
        "decode: K must be a multiple of 16 and activation rows 16-byte aligned");
  }
  if (a.max_groups <= 0 || a.max_groups > 65535 || a.shape.tiles <= 0 ||
      a.shape.tiles > 0x7FFFFFFF || a.shape.k > (int64_t{1} << 24)) {
    return Status::invalid("decode: max_groups must be 1..65535, tiles positive, K <= 2^24");
  }
  if (a.block_size != 0 && (a.block_size < 16 || (a.block_size & (a.block_size - 1)) != 0 ||
                            a.shape.k % a.block_size != 0)) {
    return Status::invalid(
        "decode: block_size must be 0 (per channel) or a power of two >= 16 dividing K, got " +
        std::to_string(a.block_size));
  }
  return Status::ok();
}

bool decode_fits(int64_t k, int block_size, bool zero_points, int bits) {
  MmaPackShape s;
  s.bits = bits;
  s.steps_per_chunk = 16 / bits;
  s.k = k;
  s.chunks = (k + 16 * s.steps_per_chunk - 1) / (16 * s.steps_per_chunk);
  return decode_smem_bytes(geometry(s, block_size), zero_points) <=
         static_cast<size_t>(kMaxDynamicSmem);
}

Status prepare_decode_kernels() {
  QMOE_RETURN_IF_ERROR(prepare_decode_bits<2>());
  QMOE_RETURN_IF_ERROR(prepare_decode_bits<3>());
  QMOE_RETURN_IF_ERROR(prepare_decode_bits<4>());
  return prepare_decode_bits<8>();
}

Status launch_decode_fc(const DecodeFcArgs& a, int max_routes, int route_groups,
                        cudaStream_t stream) {
  QMOE_RETURN_IF_ERROR(check_decode_args(a));
  if (max_routes < 1 || max_routes > kDecodeMaxRoutes) {
    return Status::invalid("decode: max_routes must be 1.." + std::to_string(kDecodeMaxRoutes) +
                           ", got " + std::to_string(max_routes));
  }
  if (route_groups != 1 && route_groups != 2) {
    return Status::invalid("decode: route_groups must be 1 or 2, got " +
                           std::to_string(route_groups));
  }
  DecodeGeometry geo = geometry(a.shape, a.block_size);
  const bool zp = a.zero_points != nullptr;
  const size_t one_row = decode_smem_bytes(geo, zp);
  if (one_row > static_cast<size_t>(kMaxDynamicSmem)) {
    return Status::invalid("decode: K = " + std::to_string(a.shape.k) +
                           " too large to stage one activation row in shared memory");
  }
  const int fit = 1 + static_cast<int>((kMaxDynamicSmem - one_row) / (geo.ld * 2));
  geo.rows_cap = std::min({max_routes, 8 * route_groups, fit});
  const size_t smem = decode_smem_bytes(geo, zp);
  switch (a.shape.bits) {
    case 2:
      return launch_decode_bits<2>(a, geo, smem, route_groups, stream);
    case 3:
      return launch_decode_bits<3>(a, geo, smem, route_groups, stream);
    case 4:
      return launch_decode_bits<4>(a, geo, smem, route_groups, stream);
    case 8:
      return launch_decode_bits<8>(a, geo, smem, route_groups, stream);
    default:
      return Status::invalid("decode: bits must be 2, 3, 4 or 8, got " +
                             std::to_string(a.shape.bits));
  }
}

}  // namespace qmoe::cuda
