// RowStager: one environment step's transitions copied into the SB3 adapter's
// staging rows in one call.
//
// Why native: SB3 calls `add` once per environment step, between the step and
// a forward pass that evict the caches, so each NumPy call of `add` runs cold
// (measured on the 2-core VM: a slice assignment ~6 us, the action bound
// check's ufuncs ~18 us; `add` 42 us against SB3's own 17). Here the usual row
// is checked and copied in one call.
//
// It only *accepts*: a row it does not take (another shape, a dtype not on its
// field's list, a non-contiguous or non-array value, an action outside the
// space) is left untouched for the adapter's checking path, which stores it or
// raises the error naming the argument. The dtypes a field takes are given by
// the caller (those NumPy casts to it safely), so the casting rule stays
// NumPy's; the values it takes are exactly those that path stores unchanged.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace py = pybind11;

namespace {

// The element types a staged field or a value may have (others: the checking path).
enum class Type { b1, i1, i2, i4, i8, u1, u2, u4, u8, f4, f8, other };

Type type_of(const py::dtype& dt) {
  constexpr char kForeignOrder = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? '>' : '<';
  if (dt.byteorder() == kForeignOrder) return Type::other;  // swapped bytes: NumPy converts them
  const auto size = dt.itemsize();
  switch (dt.kind()) {
    case 'b': return size == 1 ? Type::b1 : Type::other;
    case 'i':
      return size == 1   ? Type::i1
             : size == 2 ? Type::i2
             : size == 4 ? Type::i4
             : size == 8 ? Type::i8
                         : Type::other;
    case 'u':
      return size == 1   ? Type::u1
             : size == 2 ? Type::u2
             : size == 4 ? Type::u4
             : size == 8 ? Type::u8
                         : Type::other;
    case 'f': return size == 4 ? Type::f4 : size == 8 ? Type::f8 : Type::other;
    default: return Type::other;
  }
}

// Calls f(T{}) with the C++ type of t (never Type::other: the constructor refuses those fields).
template <class F>
void visit(Type t, F&& f) {
  switch (t) {
    case Type::b1: return f(bool{});
    case Type::i1: return f(int8_t{});
    case Type::i2: return f(int16_t{});
    case Type::i4: return f(int32_t{});
    case Type::i8: return f(int64_t{});
    case Type::u1: return f(uint8_t{});
    case Type::u2: return f(uint16_t{});
    case Type::u4: return f(uint32_t{});
    case Type::u8: return f(uint64_t{});
    case Type::f4: return f(float{});
    case Type::f8: return f(double{});
    case Type::other: break;
  }
  throw std::logic_error("RowStager: untyped field");
}

template <class S>
bool inside(S v, int64_t low, int64_t high) {
  if constexpr (std::is_floating_point_v<S>) {
    return false;  // never on a field's list for integer bounds (no safe cast); refused all the same
  } else if constexpr (std::is_unsigned_v<S>) {
    const auto u = static_cast<uint64_t>(v);
    return (low < 0 || u >= static_cast<uint64_t>(low)) && high > 0 && u < static_cast<uint64_t>(high);
  } else {
    const auto s = static_cast<int64_t>(v);
    return s >= low && s < high;
  }
}

struct Field {
  py::array dest;                               // staging rows: (rows * n_envs, *row shape), C-contiguous
  char* base;                                   // dest's data
  Type type;                                    // dest's element type
  uint32_t sources;                             // bit per Type: values of that type go in (a safe cast)
  std::vector<std::vector<py::ssize_t>> shapes;  // the shapes a value may have
  py::ssize_t count;                            // elements of one step (n_envs rows)
  std::vector<int64_t> low, high;  // per element of a row: low <= value < high (empty: no bounds)
  bool flags;  // the value is a list of n_envs Python bools
};

class RowStager {
 public:
  // fields: one dict per field, in the order put() takes the values, with
  //   dest (the staging array), sources (dtypes cast safely into it), shapes
  //   (a list of shape tuples), and optionally bounds ((low, high) int64
  //   arrays, one value per element of a row) or flags=True (a list of bools).
  RowStager(py::list fields, py::ssize_t n_envs) : n_envs_(n_envs) {
    for (py::handle spec_obj : fields) {
      py::dict spec = py::reinterpret_borrow<py::dict>(spec_obj);
      Field f;
      f.dest = spec["dest"].cast<py::array>();
      if (!(f.dest.flags() & py::array::c_style) || !f.dest.writeable())
        throw py::value_error("RowStager: dest must be a writable C-contiguous array");
      f.base = static_cast<char*>(f.dest.mutable_data());
      f.type = type_of(f.dest.dtype());
      if (f.type == Type::other)
        throw py::value_error("RowStager: dest dtype " + py::str(f.dest.dtype()).cast<std::string>() +
                              " is not a bool, integer or float32/64 type");
      f.sources = 0;
      for (py::handle dt : spec["sources"]) {
        const Type t = type_of(py::dtype::from_args(py::reinterpret_borrow<py::object>(dt)));
        if (t != Type::other) f.sources |= 1u << static_cast<int>(t);
      }
      for (py::handle shape : spec["shapes"]) f.shapes.push_back(shape.cast<std::vector<py::ssize_t>>());
      f.count = n_envs;
      for (py::ssize_t d = 1; d < f.dest.ndim(); ++d) f.count *= f.dest.shape(d);
      f.flags = spec.contains("flags") && spec["flags"].cast<bool>();
      if (spec.contains("bounds") && !spec["bounds"].is_none()) {
        auto bounds = spec["bounds"].cast<py::tuple>();
        f.low = bounds[0].cast<std::vector<int64_t>>();
        f.high = bounds[1].cast<std::vector<int64_t>>();
        if (f.low.size() != f.high.size() || n_envs * static_cast<py::ssize_t>(f.low.size()) != f.count)
          throw py::value_error("RowStager: bounds must hold one (low, high) per element of a row");
      }
      fields_.push_back(std::move(f));
    }
  }

  // Writes values[i] into field i's staging row `row` (n_envs rows from row * n_envs)
  // if every value is one it takes; otherwise writes nothing. Returns whether it wrote.
  bool put(py::ssize_t row, py::tuple values) {
    if (values.size() != fields_.size())
      throw py::value_error("RowStager.put: " + std::to_string(fields_.size()) + " values expected, got " +
                            std::to_string(values.size()));
    for (size_t i = 0; i < fields_.size(); ++i) {
      const Field& f = fields_[i];
      if ((row + 1) * f.count > f.dest.size())
        throw py::index_error("RowStager.put: staging row " + std::to_string(row) + " out of range");
      if (f.flags ? !takes_flags(values[i]) : !takes_array(f, values[i])) return false;
    }
    for (size_t i = 0; i < fields_.size(); ++i) {  // all taken: write them
      const Field& f = fields_[i];
      char* out = f.base + row * f.count * f.dest.itemsize();
      if (f.flags) write_flags(f, py::reinterpret_borrow<py::list>(values[i]), out);
      else copy(f, py::reinterpret_borrow<py::array>(values[i]), out);
    }
    return true;
  }

 private:
  bool takes_flags(py::handle value) const {
    if (!PyList_CheckExact(value.ptr()) || PyList_GET_SIZE(value.ptr()) != n_envs_) return false;
    for (py::ssize_t e = 0; e < n_envs_; ++e) {
      PyObject* item = PyList_GET_ITEM(value.ptr(), e);
      if (item != Py_True && item != Py_False) return false;
    }
    return true;
  }

  static bool takes_array(const Field& f, py::handle value) {
    if (!py::isinstance<py::array>(value)) return false;
    auto arr = py::reinterpret_borrow<py::array>(value);
    const int flags = arr.flags();
    if (!(flags & py::array::c_style) || !(flags & py::detail::npy_api::NPY_ARRAY_ALIGNED_)) return false;
    const Type t = type_of(arr.dtype());
    if (t == Type::other || !(f.sources & (1u << static_cast<int>(t)))) return false;
    if (!has_shape(f, arr)) return false;
    return f.low.empty() || in_bounds(f, arr, t);
  }

  static bool has_shape(const Field& f, const py::array& arr) {
    for (const auto& shape : f.shapes) {
      if (static_cast<size_t>(arr.ndim()) != shape.size()) continue;
      bool same = true;
      for (size_t d = 0; d < shape.size() && same; ++d) same = arr.shape(d) == shape[d];
      if (same) return true;
    }
    return false;
  }

  static bool in_bounds(const Field& f, const py::array& arr, Type t) {
    bool ok = true;
    const auto n = static_cast<py::ssize_t>(f.low.size());
    visit(t, [&](auto tag) {
      using S = decltype(tag);
      const S* v = static_cast<const S*>(arr.data());
      for (py::ssize_t i = 0; i < f.count && ok; ++i) ok = inside(v[i], f.low[i % n], f.high[i % n]);
    });
    return ok;
  }

  static void copy(const Field& f, const py::array& arr, char* out) {
    const Type t = type_of(arr.dtype());
    if (t == f.type) {
      std::memcpy(out, arr.data(), static_cast<size_t>(f.count * arr.itemsize()));
      return;
    }
    visit(t, [&](auto src_tag) {
      using S = decltype(src_tag);
      visit(f.type, [&](auto dst_tag) {
        using D = decltype(dst_tag);
        const S* src = static_cast<const S*>(arr.data());
        D* dst = reinterpret_cast<D*>(out);
        for (py::ssize_t i = 0; i < f.count; ++i) dst[i] = static_cast<D>(src[i]);
      });
    });
  }

  void write_flags(const Field& f, const py::list& flags, char* out) const {
    visit(f.type, [&](auto tag) {
      using D = decltype(tag);
      D* dst = reinterpret_cast<D*>(out);
      for (py::ssize_t e = 0; e < n_envs_; ++e)
        dst[e] = static_cast<D>(PyList_GET_ITEM(flags.ptr(), e) == Py_True);
    });
  }

  py::ssize_t n_envs_;
  std::vector<Field> fields_;
};

}  // namespace

void register_row_stager(py::module_& m) {
  py::class_<RowStager>(m, "RowStager", R"doc(
One environment step's transitions into staging rows, checked and copied in one
call (the SB3 adapter's ``add``). ``put`` writes only rows it fully accepts and
says whether it did; the caller's checking path handles the rest.
)doc")
      .def(py::init<py::list, py::ssize_t>(), py::arg("fields"), py::arg("n_envs"))
      .def("put", &RowStager::put, py::arg("row"), py::arg("values"),
           "Writes values into staging row `row` if every one is taken; returns whether it wrote.");
}
