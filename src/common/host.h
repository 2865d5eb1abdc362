// Identity of this host as seen by same-host transports: two processes share
// memory only when their boot id and PID namespace both match.
#pragma once

#include <string>

namespace ferry {

// "<boot id>/<pid namespace inode>"; stable for the life of the process.
const std::string& HostIdentity();

}  // namespace ferry
