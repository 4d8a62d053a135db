// The decode chain's timeline tables (stamps.cuh), a measurement build only (-DQMOE_STAMPS=ON):
// each reader returns its kernels' records of the calls since its last read, [slot][call *
// kStampFields + field] oldest call first, and resets them; false on a CUDA error. Slots: routing 0
// (the fused routing kernel), decode4 and decode_fp8 0 FC1 and 1 FC2 (the int4 and FP8 decode
// kernels: a translation unit each), finalize 0.
#pragma once

#if defined(QMOE_STAMPS)

#include <vector>

namespace qmoe::cuda {

namespace stamps {
// A record's fields, %globaltimer ns: the first block's entry, the first and last blocks past
// the PDL wait, the last block's end.
enum StampField : int { kEntryFirst = 0, kWaitedFirst, kWaitedLast, kEndLast, kStampFields };
}  // namespace stamps

bool stamps_take_routing(std::vector<std::vector<unsigned long long>>* out);
bool stamps_take_decode4(std::vector<std::vector<unsigned long long>>* out);
bool stamps_take_decode_fp8(std::vector<std::vector<unsigned long long>>* out);
bool stamps_take_finalize(std::vector<std::vector<unsigned long long>>* out);

}  // namespace qmoe::cuda

#endif
