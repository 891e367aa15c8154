// GGUF metadata values: the thirteen GGUF value types, arrays of any of them (arrays of arrays included).
//
//   gguf_value n = uint32_t{5};                                 // type() == gguf_type::uint32
//   gguf_value s = "llama";                                     // a string, never a bool
//   gguf_value toks = std::vector<std::string>{"<unk>", "<s>"}; // an array of strings
//   if (const uint32_t* v = n.get_if<uint32_t>()) ...           // exact type, else nullptr
//   if (auto u = n.as_uint()) ...                               // any integer type, range-checked
//   const auto* t = toks.get_if<std::vector<std::string>>();    // typed view of an array
//
// Arrays are stored compactly, one std::vector of the element type (std::vector<gguf_array> for arrays of
// arrays), so a large uint8 or int32 array costs what its elements cost. Equality is exact: floats compare by
// bit pattern, so NaNs round-trip and compare equal to themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace troupe {

// GGUF value type ids, as stored in the file.
enum class gguf_type : uint32_t {
  uint8 = 0,
  int8 = 1,
  uint16 = 2,
  int16 = 3,
  uint32 = 4,
  int32 = 5,
  float32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  uint64 = 10,
  int64 = 11,
  float64 = 12,
};

constexpr uint32_t gguf_type_count = 13;  // ids are < this

// "uint8", ..., "bool", "string", "array", ...; "unknown" for an id outside the enum.
std::string_view gguf_type_name(gguf_type t);

// Bytes of one value in the file for fixed-size types; 0 for string and array.
size_t gguf_type_size(gguf_type t);

// An array value: an element type and the elements. The elements of an array of arrays are arrays whose
// element types may differ from each other.
class gguf_array {
 public:
  // One alternative per element type, in gguf_type id order (the array alternative holds arrays).
  using storage = std::variant<std::vector<uint8_t>, std::vector<int8_t>, std::vector<uint16_t>,
                               std::vector<int16_t>, std::vector<uint32_t>, std::vector<int32_t>,
                               std::vector<float>, std::vector<bool>, std::vector<std::string>,
                               std::vector<gguf_array>, std::vector<uint64_t>, std::vector<int64_t>,
                               std::vector<double>>;

  gguf_array() = default;  // an empty array of uint8
  template <class T>
  explicit gguf_array(std::vector<T> v) : values_(std::move(v)) {}
  // An empty array of the given element type.
  static gguf_array empty_of(gguf_type elem_type);

  gguf_type elem_type() const { return static_cast<gguf_type>(values_.index()); }
  size_t size() const;

  // The elements when they are of type T (one of storage's vector element types), else nullptr.
  template <class T>
  const std::vector<T>* get_if() const {
    return std::get_if<std::vector<T>>(&values_);
  }

  const storage& values() const { return values_; }
  storage& values() { return values_; }

  friend bool operator==(const gguf_array& a, const gguf_array& b);

 private:
  storage values_;
};

// One metadata value of any GGUF type.
class gguf_value {
 public:
  // One alternative per gguf_type, in id order: index() == the type id.
  using storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string,
                               gguf_array, uint64_t, int64_t, double>;

  gguf_value() = default;  // uint8 0
  gguf_value(uint8_t v) : v_(v) {}
  gguf_value(int8_t v) : v_(v) {}
  gguf_value(uint16_t v) : v_(v) {}
  gguf_value(int16_t v) : v_(v) {}
  gguf_value(uint32_t v) : v_(v) {}
  gguf_value(int32_t v) : v_(v) {}
  gguf_value(float v) : v_(v) {}
  gguf_value(bool v) : v_(v) {}
  gguf_value(std::string v) : v_(std::move(v)) {}
  gguf_value(std::string_view v) : v_(std::string(v)) {}
  gguf_value(const char* v) : v_(std::string(v)) {}  // a string, not a bool
  gguf_value(gguf_array v) : v_(std::move(v)) {}
  gguf_value(uint64_t v) : v_(v) {}
  gguf_value(int64_t v) : v_(v) {}
  gguf_value(double v) : v_(v) {}
  template <class T>
  gguf_value(std::vector<T> v) : v_(gguf_array(std::move(v))) {}

  gguf_type type() const { return static_cast<gguf_type>(v_.index()); }

  // The value when it is exactly of type T, else nullptr. T is a scalar type, std::string, gguf_array, or
  // std::vector<E> (an array whose elements are E).
  template <class T>
  const T* get_if() const {
    if constexpr (is_vector<T>::value) {
      const gguf_array* a = std::get_if<gguf_array>(&v_);
      return a ? a->get_if<typename T::value_type>() : nullptr;
    } else {
      return std::get_if<T>(&v_);
    }
  }

  // Integer values of any integer type that fit the result; empty for other types or out of range.
  std::optional<uint64_t> as_uint() const;
  std::optional<int64_t> as_int() const;
  // float32 or float64 as a double; empty for other types.
  std::optional<double> as_float() const;

  // A short human-readable rendering: numbers, quoted strings, arrays with at most max_elems elements shown.
  std::string to_string(size_t max_elems = 8) const;

  const storage& value() const { return v_; }

  friend bool operator==(const gguf_value& a, const gguf_value& b);

 private:
  template <class T>
  struct is_vector : std::false_type {};
  template <class E>
  struct is_vector<std::vector<E>> : std::true_type {};

  storage v_;
};

// One metadata entry.
struct gguf_kv {
  std::string key;
  gguf_value value;

  friend bool operator==(const gguf_kv& a, const gguf_kv& b) = default;
};

}  // namespace troupe
