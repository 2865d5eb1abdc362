#include "common/thread_name.h"

#include <pthread.h>

#include <cstring>
#include <string>

namespace ferry {

void NameThisThread(const char* name) {
  // The kernel refuses a name of 16 bytes or more: truncate instead.
  std::string n(name, strnlen(name, 15));
  pthread_setname_np(pthread_self(), n.c_str());
}

}  // namespace ferry
