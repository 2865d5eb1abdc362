// Not compiled: input for the check-process-hardening self-test, which must reject it.
void Bad(int pid, int fd) {
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  open(("/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd)).c_str(), O_RDWR);
}
