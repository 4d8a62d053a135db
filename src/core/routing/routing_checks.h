// Validation of a RoutingSpec, shared by the host's route() and the device routing's launcher so
// that both refuse exactly the same specs with the same messages.
#pragma once

#include <cstdint>

#include "qmoe/layer.h"
#include "qmoe/status.h"

namespace qmoe {

// Checks the routing attributes against num_experts (E, shared experts included).
Status check_routing_spec(const RoutingSpec& r, int64_t num_experts);

}  // namespace qmoe
