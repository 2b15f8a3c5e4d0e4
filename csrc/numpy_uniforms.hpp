// NumpyUniforms: uniforms in [0, 1) drawn from a numpy.random.Generator in C++, the stream
// `rng.random(n)` gives.
//
// NumPy exposes each bit generator's C `next_double` through ctypes, and its
// `random(n)` is n calls of it; calling it here gives the same values without
// a Python call per draw, so every backend and executor turns one seed into the
// same uniforms. The bit generator's lock is held while drawing, as NumPy does.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

namespace hetero_replay {

class NumpyUniforms {
 public:
  // Draws n uniforms from `generator` into out (the caller holds the GIL).
  void draw(pybind11::handle generator, double* out, int64_t n) {
    bind(generator);
    acquire_();
    for (int64_t i = 0; i < n; ++i) out[i] = next_double_(state_);
    release_();
  }

 private:
  void bind(pybind11::handle generator) {
    if (rng_ && rng_.is(generator)) return;
    if (!pybind11::hasattr(generator, "bit_generator"))
      throw pybind11::type_error("rng must be a numpy.random.Generator");
    pybind11::object bitgen = generator.attr("bit_generator");
    pybind11::object iface = bitgen.attr("ctypes");
    pybind11::module_ ctypes = pybind11::module_::import("ctypes");
    const uintptr_t fn = ctypes.attr("cast")(iface.attr("next_double"), ctypes.attr("c_void_p"))
                             .attr("value")
                             .cast<uintptr_t>();
    state_ = reinterpret_cast<void*>(iface.attr("state_address").cast<uintptr_t>());
    next_double_ = reinterpret_cast<double (*)(void*)>(fn);
    pybind11::object lock = bitgen.attr("lock");
    acquire_ = lock.attr("acquire");
    release_ = lock.attr("release");
    rng_ = pybind11::reinterpret_borrow<pybind11::object>(generator);
  }

  pybind11::object rng_;   // the Generator last bound
  pybind11::object acquire_, release_;  // its bit generator's lock's methods
  void* state_ = nullptr;
  double (*next_double_)(void*) = nullptr;
};

}  // namespace hetero_replay
