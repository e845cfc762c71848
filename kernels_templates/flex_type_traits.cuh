// The type traits the templates need (NVRTC compiles them without the standard library's <type_traits>).
#pragma once

namespace flex {

template <class A, class B>
struct IsSame {
  static constexpr bool value = false;
};
template <class A>
struct IsSame<A, A> {
  static constexpr bool value = true;
};

template <bool kCond, class T, class F>
struct Conditional {
  using type = T;
};
template <class T, class F>
struct Conditional<false, T, F> {
  using type = F;
};

}  // namespace flex
