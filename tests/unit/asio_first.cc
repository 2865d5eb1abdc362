// Regression check, at compile time: asio must make the same allocation choice
// in a file that includes it before any standard header (as lane.h did) and in
// one that includes a standard header first (unit_test.cc). They disagreed, and
// handler memory from aligned_alloc was released with operator delete.
#include <asio.hpp>

#ifdef ASIO_HAS_STD_ALIGNED_ALLOC
#error "asio's aligned allocation must be disabled for every file; see CMakeLists.txt"
#endif
