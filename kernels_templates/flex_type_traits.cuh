// The one type trait the templates need (NVRTC compiles them without the standard library's <type_traits>).
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

}  // namespace flex
