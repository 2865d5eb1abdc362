#include "cli/cli.h"
namespace ferry::cli {
int BenchStore(const BenchStoreArgs&) { return 1; }
}  // namespace ferry::cli
