// What the binding's files share: ferry::Status to ferry.errors, the GIL
// released around blocking calls, and pointers as ints. Includes only
// pybind11, Ferry's public headers and the standard library, as the binding
// files do (python/check-includes.sh).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <utility>

#include "ferry/status.h"

namespace ferry_py {

// Raises ferry.errors' class for the code. The lookup runs only on failure.
[[noreturn]] inline void Raise(const ferry::Status& st) {
  pybind11::object cls =
      pybind11::module_::import("ferry.errors").attr("error_class")(static_cast<int>(st.code()));
  PyErr_SetObject(cls.ptr(), pybind11::str(st.ToString()).ptr());
  throw pybind11::error_already_set();
}

[[noreturn]] inline void RaiseInvalid(std::string message) {
  Raise(ferry::Status::InvalidArgument(std::move(message)));
}

inline void Check(const ferry::Status& st) {
  if (!st.ok()) Raise(st);
}

template <typename T>
T Take(ferry::Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

// Runs `f` with the GIL released; its Status is checked after the GIL is back.
template <typename F>
auto NoGil(F&& f) {
  pybind11::gil_scoped_release nogil;
  return f();
}

inline void* Ptr(uint64_t addr) { return reinterpret_cast<void*>(static_cast<uintptr_t>(addr)); }
inline uint64_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace ferry_py
