// CRC-32C (Castagnoli, the polynomial of iSCSI, ext4 and SCTP): the
// integrity check of tcp's checksummed frames (transfer/frame_wire.h). The
// SSE4.2 crc32 instruction where the CPU has it, three streams at once;
// a table otherwise. Both give the same values.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::crc32c {

// The CRC of what came before (`crc`; 0 for nothing) followed by
// [data, data+n), so a message may be checksummed in pieces.
uint32_t Extend(uint32_t crc, const void* data, size_t n);
inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }

// Whether Extend uses the SSE4.2 instruction on this CPU.
bool Accelerated();
// The table version, whatever the CPU: for tests, which compare the two.
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);

}  // namespace ferry::crc32c
