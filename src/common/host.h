// Identity of this host as seen by same-host transports: two processes share
// memory only when their boot id and PID namespace both match.
#pragma once

#include <string>

namespace ferry {

// "<boot id>/<pid namespace inode>"; stable for the life of the process.
const std::string& HostIdentity();

// Whether `host` (an IP literal, bracketed or not, or "localhost") can only
// be reached from this host: 127.0.0.0/8, ::1 or an IPv4-mapped 127 address.
bool IsLoopbackHost(const std::string& host);

// `host` without the brackets of an IPv6 literal ("[::1]" -> "::1"), as
// getaddrinfo and inet_pton take it; any other host as it is.
std::string Unbracketed(const std::string& host);

}  // namespace ferry
