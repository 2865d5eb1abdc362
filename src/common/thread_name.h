// Names the calling thread (at most 15 characters are kept), so `top -H`,
// /proc/<pid>/task/*/comm and debuggers tell Ferry's threads apart.
#pragma once

namespace ferry {

void NameThisThread(const char* name);

}  // namespace ferry
