// Not compiled: input for the check-cuda-calls self-test, which must reject it.
void Bad(void* dst, const void* src, unsigned long n) {
  cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, 0);
  cudaDeviceSynchronize();
}
