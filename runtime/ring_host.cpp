// Ring attention's back end on the CPU: scratch in host vectors, the element-wise steps as host loops (the merge in
// double precision), launches on the CPU backend.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "dsl/error.h"
#include "runtime/npy.h"
#include "runtime/ring_backend.h"

namespace flexjit {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float load_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::F16: return half_to_float(static_cast<const uint16_t*>(base)[i]);
    default: break;
  }
  throw Error(fmt::format("ring attention: tensors of {} are not floating point; use f32, bf16 or f16", dsl::dtype_name(t)));
}

void store_float(void* base, DType t, int64_t i, float x) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[i] = x; return;
    case DType::BF16: static_cast<uint16_t*>(base)[i] = float_to_bf16(x); return;
    case DType::F16: static_cast<uint16_t*>(base)[i] = float_to_half(x); return;
    default: break;
  }
  throw Error(fmt::format("ring attention: tensors of {} are not floating point; use f32, bf16 or f16", dsl::dtype_name(t)));
}

int64_t at(const RingView4& v, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * v.stride[0] + i1 * v.stride[1] + i2 * v.stride[2] + i3 * v.stride[3];
}

class HostRingBackend final : public RingBackend {
 public:
  Device device() const override { return Device::cpu(); }
  void begin(Kernel&, int, CUstream, const RingLaunchSizes&) override {}
  void join() override {}
  std::vector<CUstream> streams() const override { return {}; }

  Tensor scratch(int lane, int slot, DType dtype, std::vector<int64_t> shape) override {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<unsigned char>& bytes = memory_[{lane, slot}];
    bytes.resize(std::max(bytes.size(), static_cast<size_t>(n * dsl::dtype_size(dtype))));
    return Tensor::contiguous(bytes.data(), dtype, std::move(shape));
  }

  void fill(const Tensor& t, float value, int) override {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::fill_n(static_cast<float*>(t.data), n, value);
  }

  void copy(const Tensor& src, const Tensor& dst, RingCopy mode, int) override { host_ring_copy(src, dst, mode); }

  void merge(const Tensor& o_part, const Tensor& lse_part, const Tensor& o_acc, const Tensor& lse_acc, int) override {
    const RingView4 op = ring_view4(o_part), oa = ring_view4(o_acc), lp4 = ring_view4(lse_part), la4 = ring_view4(lse_acc);
    const float* lps = static_cast<const float*>(lse_part.data);
    float* las = static_cast<float*>(lse_acc.data);
    float* acc = static_cast<float*>(o_acc.data);
    // lse views are [1, B, H, rows] as four dims: b, h, r sit one dim further in.
    for (int64_t b = 0; b < op.shape[0]; ++b)
      for (int64_t h = 0; h < op.shape[1]; ++h)
        for (int64_t r = 0; r < op.shape[2]; ++r) {
          const float lp = lps[at(lp4, 0, b, h, r)];
          if (lp == kNegInf) continue;
          float& lm_ref = las[at(la4, 0, b, h, r)];
          const float lm = lm_ref;
          double wm = 0, wp = 1, l = lp;
          if (lm != kNegInf) {
            const double mx = std::max<double>(lm, lp);
            wm = std::exp(lm - mx);
            wp = std::exp(lp - mx);
            l = mx + std::log(wm + wp);
          }
          const double inv = 1.0 / (wm + wp);
          lm_ref = static_cast<float>(l);
          for (int64_t e = 0; e < op.shape[3]; ++e) {
            float& a = acc[at(oa, b, h, r, e)];
            const double part = load_float(o_part.data, o_part.dtype, at(op, b, h, r, e));
            a = static_cast<float>((wm * a + wp * part) * inv);
          }
        }
  }

  void forward(Kernel& kernel, AttentionArgs& a, int) override {
    a.device = Device::cpu();
    kernel.forward(a);
  }
  void backward(Kernel& kernel, BackwardArgs& a, int) override {
    a.device = Device::cpu();
    kernel.backward(a);
  }
  void check_errors(Kernel&) override {}

 private:
  std::map<std::pair<int, int>, std::vector<unsigned char>> memory_;
};

}  // namespace

void host_ring_copy(const Tensor& src, const Tensor& dst, RingCopy mode) {
  check_ring_copy(src, dst, mode);
  const RingView4 s = ring_view4(src), d = ring_view4(dst);
  const bool bits = mode == RingCopy::Assign && src.dtype == dst.dtype;
  const size_t size = static_cast<size_t>(dsl::dtype_size(src.dtype));
  for (int64_t i0 = 0; i0 < s.shape[0]; ++i0)
    for (int64_t i1 = 0; i1 < s.shape[1]; ++i1)
      for (int64_t i2 = 0; i2 < s.shape[2]; ++i2)
        for (int64_t i3 = 0; i3 < s.shape[3]; ++i3) {
          const int64_t so = at(s, i0, i1, i2, i3), dof = at(d, i0, i1, i2, i3);
          if (bits) {
            std::memcpy(static_cast<unsigned char*>(dst.data) + dof * int64_t(size), static_cast<const unsigned char*>(src.data) + so * int64_t(size),
                        size);
            continue;
          }
          float x = load_float(src.data, src.dtype, so);
          if (mode == RingCopy::Add) x += static_cast<const float*>(dst.data)[dof];
          store_float(dst.data, dst.dtype, dof, x);
        }
}

std::unique_ptr<RingBackend> make_host_ring_backend() { return std::make_unique<HostRingBackend>(); }

}  // namespace flexjit
