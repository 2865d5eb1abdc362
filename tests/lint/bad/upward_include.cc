// The transfer layer may not include the store: compiled with the transfer
// layer's view (CMakeLists.txt, ferry_layer), this must fail.
#include "store/node/core.h"
