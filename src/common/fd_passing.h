// File descriptors passed over a Unix stream socket (SCM_RIGHTS). Both calls
// are one non-blocking sendmsg/recvmsg: callers loop, and wait with poll.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <vector>

namespace ferry {

// Sends up to `n` bytes of `data`, with `fd` attached when it is >= 0 (the
// fd goes with the first byte sent; the caller still owns its copy). As
// sendmsg with MSG_DONTWAIT | MSG_NOSIGNAL: the bytes sent, or -1 and errno.
ssize_t SendWithFd(int sock, const void* data, size_t n, int fd);
// The same, gathering the bytes from `count` buffers.
ssize_t SendWithFd(int sock, const iovec* iov, size_t count, int fd);

// Receives up to `n` bytes into `data`, appending the fds that came with them
// to `fds`, close-on-exec; the caller owns them. As recvmsg with
// MSG_DONTWAIT: the bytes received, 0 at end of stream, or -1 and errno;
// -1 and EMSGSIZE when more than four fds came at once (those that fit are
// appended all the same).
ssize_t ReceiveWithFds(int sock, void* data, size_t n, std::vector<int>* fds);

}  // namespace ferry
