// The transfer layer may include what lies below it: compiled with the
// transfer layer's view, this builds (the control of upward_include.cc).
#include "common/clock.h"
#include "gpu/gpu.h"
