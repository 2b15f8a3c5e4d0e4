// ReleasedGil: py::gil_scoped_release that a daemon thread may be inside when the interpreter exits.
//
// A thread that takes the GIL back while the interpreter finalizes is not
// allowed to run Python again: CPython up to 3.13 ends it with pthread_exit,
// which unwinds its stack with a "forced unwind" exception. Unwinding out of
// py::gil_scoped_release's destructor (implicitly noexcept) calls
// std::terminate: the whole process dies with SIGABRT ("terminate called
// without an active exception") at what should be a clean exit. Letting the
// unwind through instead would run the frames' destructors, which drop
// references to Python objects without the GIL while the interpreter is being
// torn down. So this thread stops where it is, for good, as CPython 3.14
// itself does: it holds no lock of ours (callers end their lock scopes inside
// this one), and the process's exit ends it.
#pragma once

#include <pybind11/pybind11.h>

#include <unistd.h>

#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif

namespace hetero_replay {

class ReleasedGil {
 public:
  ReleasedGil() : state_(PyEval_SaveThread()) {}
  ReleasedGil(const ReleasedGil&) = delete;
  ReleasedGil& operator=(const ReleasedGil&) = delete;

  ~ReleasedGil() {
#if defined(__GLIBCXX__)
    try {
      PyEval_RestoreThread(state_);
    } catch (abi::__forced_unwind&) {  // the interpreter is finalizing: never run Python again
      for (;;) pause();
    }
#else
    PyEval_RestoreThread(state_);
#endif
  }

 private:
  PyThreadState* state_;
};

}  // namespace hetero_replay
