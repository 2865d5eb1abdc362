// Built when no CUDA toolkit was found at configure time: there is no GPU.
#include "gpu/gpu.h"

namespace ferry::gpu {

int DeviceCount() { return 0; }
std::string Describe() { return "no GPU: built without CUDA"; }
MemoryInfo Classify(const void*) { return {}; }
bool PinHost(void*, size_t) { return false; }
void UnpinHost(void*) {}
std::string ExportIpc(const MemoryInfo&) { return {}; }
Result<void*> OpenIpc(const std::string&, int) {
  return Status::NotSupported("built without CUDA");
}
void CloseIpc(void*, int) {}
IpcImportCounts IpcImports() { return {}; }
Result<void*> AllocDevice(size_t, int) { return Status::NotSupported("built without CUDA"); }
void FreeDevice(void*) {}
Result<void*> AllocPinned(size_t) { return Status::NotSupported("built without CUDA"); }
void FreePinned(void*) {}
Result<std::unique_ptr<StagedPipe>> StagedPipe::Create(int, size_t) {
  return Status::NotSupported("built without CUDA");
}
Result<double> CopyBandwidth(int, int, size_t, double, int) {
  return Status::NotSupported("built without CUDA");
}
Result<double> CopyInFromWrittenBandwidth(int, size_t, double, bool) {
  return Status::NotSupported("built without CUDA");
}

Result<double> StagingBandwidth(int out_device, int in_device, size_t, double, size_t,
                                const std::function<bool()>&) {
  if (out_device < 0 && in_device < 0) return Status::InvalidArgument("no GPU end to stage");
  return Status::NotSupported("built without CUDA");
}

}  // namespace ferry::gpu

#include "gpu/copier.h"

namespace ferry::gpu {

class ReadyEvent {};

Result<std::unique_ptr<Copier>> Copier::Create() {
  return Status::NotSupported("built without CUDA");
}

}  // namespace ferry::gpu
