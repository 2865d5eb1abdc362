// Test hooks of the store, kept out of the public API.
#pragma once

#include <memory>

#include "common/clock.h"
#include "ferry/store.h"

namespace ferry::store::testing {

// Store::Create, with a pause of `delay` between each get's lookup and its
// read, as a slow reader would: for tests of read leases.
Result<std::unique_ptr<Store>> CreateWithReadDelay(StoreOptions options, Millis delay);

}  // namespace ferry::store::testing
