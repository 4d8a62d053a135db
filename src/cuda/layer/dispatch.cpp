// The dispatch table (dispatch.h).
#include "cuda/layer/dispatch.h"

#include <algorithm>
#include <cmath>

#include "cuda/decode/decode_gemv.h"

namespace qmoe::cuda {

std::string choice_name(const DispatchChoice& c) {
  if (c.path == CallPath::kGeneric) {
    return c.tile == 0 ? "generic" : "generic/" + std::to_string(c.tile);
  }
  if (c.path == CallPath::kFused) return "fused";
  return "decode/1";
}

namespace {

// Every choice there is, in the order of dispatch_choice_names() (qmoe/tuning.h: the names that
// options and tune files are checked against before a layer exists); test_gpu_dispatch checks
// that the two agree.
constexpr DispatchChoice kChoices[] = {{CallPath::kGeneric},     {CallPath::kDecode},
                                       {CallPath::kFused},       {CallPath::kGeneric, 32},
                                       {CallPath::kGeneric, 64}, {CallPath::kGeneric, 128},
                                       {CallPath::kGeneric, 144}};
constexpr bool one_generic_choice_per_tile() {
  constexpr size_t kTiles = sizeof(kMixedTiles) / sizeof(kMixedTiles[0]);
  if (sizeof(kChoices) / sizeof(kChoices[0]) != 3 + kTiles) return false;
  for (size_t i = 0; i < kTiles; ++i) {
    if (kChoices[3 + i].path != CallPath::kGeneric || kChoices[3 + i].tile != kMixedTiles[i]) {
      return false;
    }
  }
  return true;
}
static_assert(one_generic_choice_per_tile(), "a generic choice per tile, in kMixedTiles' order");

}  // namespace

double mixed_padded_rows(int64_t routes, int64_t experts, int tile) {
  if (routes <= 0 || experts <= 0 || tile <= 0) return 0.0;
  const double p = 1.0 / static_cast<double>(experts), mean = static_cast<double>(routes) * p;
  const double sd = std::sqrt(static_cast<double>(routes) * p * (1.0 - p));
  // E[ceil(r / N)] = sum over j >= 0 of P(r > j N), each term with the continuity correction.
  double tiles = 0.0;
  for (int64_t j = 0; static_cast<double>(j * tile) <= mean + 8.0 * sd; ++j) {
    const double over = static_cast<double>(j * tile) + 0.5 - mean;
    tiles += sd > 0.0 ? 0.5 * std::erfc(over / (sd * std::sqrt(2.0))) : (over < 0.0 ? 1.0 : 0.0);
  }
  return tiles * tile;
}

int mixed_tile_for(int64_t routes, int64_t experts, int64_t mid_routes) {
  const int64_t narrow = experts < kMixedFewExperts ? kMixedNarrowRoutesFew : kMixedNarrowRoutes;
  if (routes <= narrow * experts) return 32;
  if (routes <= mid_routes * experts) return 64;
  const double wide = mixed_padded_rows(routes, experts, 144);
  return wide < (1.0 - kMixedWideMinGain) * mixed_padded_rows(routes, experts, 128) ? 144 : 128;
}

bool parse_choice(const std::string& name, DispatchChoice* out) {
  for (const DispatchChoice& c : kChoices) {
    if (choice_name(c) == name) {
      *out = c;
      return true;
    }
  }
  return false;
}

std::vector<DispatchChoice> dispatch_candidates(bool decode_supported, int64_t tokens,
                                                int64_t fused_max_tokens,
                                                const std::vector<int>& tiles) {
  std::vector<DispatchChoice> c;
  if (tiles.empty()) c.push_back(DispatchChoice{CallPath::kGeneric});
  for (int t : tiles) c.push_back(DispatchChoice{CallPath::kGeneric, t});
  if (decode_supported && tokens >= 1 && tokens <= kDecodeMaxRoutes) {
    c.push_back(DispatchChoice{CallPath::kDecode});
  }
  if (tokens >= 1 && tokens <= fused_max_tokens) c.push_back(DispatchChoice{CallPath::kFused});
  return c;
}

std::vector<DispatchChoice> layer_choices(bool decode_supported, int64_t fused_max_tokens,
                                          const std::vector<int>& tiles) {
  std::vector<DispatchChoice> all;
  for (const DispatchChoice& c : kChoices) {
    const bool offered =
        c.path == CallPath::kGeneric
            ? c.tile == 0 || std::find(tiles.begin(), tiles.end(), c.tile) != tiles.end()
            : (c.path == CallPath::kDecode ? decode_supported : fused_max_tokens > 0);
    if (offered) all.push_back(c);
  }
  return all;
}

Status DispatchTable::apply_tuned(const std::vector<TunedRow>& rows) {
  std::vector<std::pair<int64_t, DispatchChoice>> t;
  int64_t prev = 0;
  for (const TunedRow& r : rows) {
    DispatchChoice c;
    if (!parse_choice(r.choice, &c)) {
      return Status::invalid("tuned dispatch: unknown choice '" + r.choice + "' (expected " +
                             dispatch_choice_list() + ")");
    }
    if (r.max_tokens <= prev) {
      return Status::invalid("tuned dispatch: max_tokens must increase");
    }
    prev = r.max_tokens;
    t.emplace_back(r.max_tokens, c);
  }
  tuned_ = std::move(t);
  return Status::ok();
}

DispatchChoice DispatchTable::analytic(int64_t tokens) const {
  int64_t mean_cap = kDecodeMaxMeanRoutes;
  bool floor = true;  // every call of up to kDecodeWindowTokens
  switch (generic_) {
    case GenericKind::kDequantize:
      break;
    case GenericKind::kReadsCodes:
      mean_cap = kDecodeMaxMeanRoutesNoDequant;
      break;
    case GenericKind::kNarrow4:
      mean_cap = kDecodeMaxMeanRoutesNarrow4, floor = false;
      break;
    case GenericKind::kNarrow8:
      mean_cap = kDecodeMaxMeanRoutesNarrow8, floor = false;
      break;
    case GenericKind::kZero4:
      mean_cap = kDecodeMaxMeanRoutesZero4, floor = false;
      break;
    case GenericKind::kZero8:
      mean_cap = kDecodeMaxMeanRoutesZero8, floor = false;
      break;
    case GenericKind::kE4m3Copy:
    case GenericKind::kE4m3Fp8: {
      const int64_t small = generic_ == GenericKind::kE4m3Copy ? kDecodeMaxMeanRoutesE4m3Copy
                                                               : kDecodeMaxMeanRoutesE4m3Fp8;
      mean_cap = expert_bytes_ >= kE4m3CopyLargeExpertBytes ? kDecodeMaxMeanRoutesE4m3CopyLarge
                                                            : small;
      floor = false;
      break;
    }
  }
  bool in_window =
      (floor && tokens <= kDecodeWindowTokens) || tokens * slots_ <= mean_cap * experts_;
  if (expert_bytes_ >= kDecodeLargeExpertBytes) {
    // Expected touched experts under uniform routing (all of them once slots >= experts).
    const double miss = slots_ >= experts_ ? 0.0 : 1.0 - static_cast<double>(slots_) / experts_;
    const double touched = static_cast<double>(experts_) * (1.0 - std::pow(miss, tokens));
    const double bound = grouped_ ? kDecodeMaxRoutesPerTouchedGrouped : kDecodeMaxRoutesPerTouched;
    in_window = static_cast<double>(tokens * slots_) <= bound * touched;
  }
  if (!decode_supported_ || tokens > kDecodeMaxRoutes || !in_window) {
    return DispatchChoice{CallPath::kGeneric};
  }
  return DispatchChoice{CallPath::kDecode};
}

DispatchChoice DispatchTable::feasible(DispatchChoice c, int64_t tokens) const {
  if (c.path == CallPath::kFused && tokens > fused_max_tokens_)
    c = DispatchChoice{CallPath::kDecode};
  if (c.path == CallPath::kDecode && (!decode_supported_ || tokens > kDecodeMaxRoutes)) {
    return DispatchChoice{CallPath::kGeneric};
  }
  return c;
}

DispatchChoice DispatchTable::table_choice(int64_t tokens) const {
  for (const auto& [max_tokens, c] : tuned_) {
    if (tokens <= max_tokens) return feasible(c, tokens);
  }
  return analytic(tokens);
}

DispatchChoice DispatchTable::choose(int64_t tokens) const {
  return forced_ ? feasible(forced_choice_, tokens) : table_choice(tokens);
}

}  // namespace qmoe::cuda
