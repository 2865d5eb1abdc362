// Skips a GPU test, with the reason, where there is no GPU (CI).
#pragma once

#include <gtest/gtest.h>

#include "gpu/gpu.h"

#define SKIP_WITHOUT_GPU() \
  if (::ferry::gpu::DeviceCount() == 0) GTEST_SKIP() << ::ferry::gpu::Describe()
