// qmoe: the whole public API.
#pragma once

#include "qmoe/backend.h"
#include "qmoe/convert.h"
#include "qmoe/format.h"
#include "qmoe/io.h"
#include "qmoe/layer.h"
#include "qmoe/ort.h"
#include "qmoe/quantize.h"
#include "qmoe/routing.h"
#include "qmoe/status.h"
#include "qmoe/tensor.h"
#include "qmoe/tuning.h"
