// A float64 reference of flex attention for tests: naive loops, the mods evaluated with the
// interpreter at every (b, h, q, kv), parallel over rows. Independent of every back end.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "compiler/bindings.h"
#include "compiler/interpreter.h"
#include "compiler/spec_ir.h"

namespace flexjit::test {

struct RefShape {
  int64_t B, H, Hkv, Sq, Skv, D, Dv;
};

struct RefResult {
  std::vector<double> o;    // [B, H, Sq, Dv]
  std::vector<double> lse;  // [B, H, Sq]; -inf for fully masked rows
};

// q [B,H,Sq,D], k [B,Hkv,Skv,D], v [B,Hkv,Skv,Dv] as contiguous float arrays (already rounded to the kernel's
// input precision), for the rows (b * H + h) * Sq + q listed in `rows`: r.o and r.lse hold them in that order.
// `query_offset` shifts q for decode-style calls, `batch_offset` b for one sequence of a ragged batch. Long
// sequences check a sample of rows this way.
inline RefResult reference_attention_rows(const SpecIR& ir, const RefShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                          const std::vector<float>& v, const EvalEnv& base_env, double scale,
                                          const std::vector<int64_t>& rows, int64_t query_offset = 0, int64_t batch_offset = 0) {
  RefResult r;
  r.o.assign(rows.size() * static_cast<size_t>(s.Dv), 0.0);
  r.lse.assign(rows.size(), -std::numeric_limits<double>::infinity());
  auto work = [&](size_t first, size_t last) {
    EvalEnv env = base_env;
    std::vector<double> scores(static_cast<size_t>(s.Skv));
    for (size_t i = first; i < last; ++i) {
      const int64_t row = rows[i];
      int64_t b = row / (s.H * s.Sq), h = (row / s.Sq) % s.H, qi = row % s.Sq;
      int64_t hkv = h / (s.H / s.Hkv);
      const float* qp = &q[static_cast<size_t>(((b * s.H + h) * s.Sq + qi) * s.D)];
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t kv = 0; kv < s.Skv; ++kv) {
        const float* kp = &k[static_cast<size_t>(((b * s.Hkv + hkv) * s.Skv + kv) * s.D)];
        double dot = 0;
        for (int64_t d = 0; d < s.D; ++d) dot += double(qp[d]) * double(kp[d]);
        double sc = dot * scale;
        env.vars[int(dsl::VarId::B)] = b + batch_offset;
        env.vars[int(dsl::VarId::H)] = h;
        env.vars[int(dsl::VarId::KvHead)] = hkv;
        env.vars[int(dsl::VarId::Q)] = qi + query_offset;
        env.vars[int(dsl::VarId::KV)] = kv;
        if (ir.score_mod) {
          env.score = static_cast<float>(sc);
          sc = evaluate(ir.score_mod, env).f;
        }
        if (ir.mask_mod && !evaluate(ir.mask_mod, env).b) sc = -std::numeric_limits<double>::infinity();
        scores[kv] = sc;
        mx = std::max(mx, sc);
      }
      if (mx == -std::numeric_limits<double>::infinity()) continue;  // fully masked: O = 0, LSE = -inf
      double sum = 0;
      for (double& x : scores) sum += (x = std::exp(x - mx));
      double* op = &r.o[i * static_cast<size_t>(s.Dv)];
      for (int64_t kv = 0; kv < s.Skv; ++kv) {
        if (scores[kv] == 0) continue;
        const float* vp = &v[static_cast<size_t>(((b * s.Hkv + hkv) * s.Skv + kv) * s.Dv)];
        for (int64_t d = 0; d < s.Dv; ++d) op[d] += scores[kv] * double(vp[d]);
      }
      for (int64_t d = 0; d < s.Dv; ++d) op[d] /= sum;
      r.lse[i] = mx + std::log(sum);
    }
  };
  const size_t threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  const size_t chunk = (rows.size() + threads - 1) / threads;
  for (size_t t = 0; t < threads; ++t) {
    const size_t a = t * chunk, e = std::min(rows.size(), a + chunk);
    if (a < e) pool.emplace_back(work, a, e);
  }
  for (auto& th : pool) th.join();
  return r;
}

// Every row of the launch (reference_attention_rows over all of them).
inline RefResult reference_attention(const SpecIR& ir, const RefShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v, const EvalEnv& base_env, double scale, int64_t query_offset = 0,
                                     int64_t batch_offset = 0) {
  std::vector<int64_t> rows(static_cast<size_t>(s.B * s.H * s.Sq));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  return reference_attention_rows(ir, s, q, k, v, base_env, scale, rows, query_offset, batch_offset);
}

struct Comparison {
  double rel_l2 = 0;       // ||out - ref|| / ||ref||
  double max_abs = 0;
  int64_t bad = 0;         // NaN, or mismatched -inf
  int64_t first_bad = -1;
};

// Compares every element; NaN never passes; -inf must match -inf exactly.
inline Comparison compare(const std::vector<float>& out, const std::vector<double>& ref) {
  Comparison c;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double o = out[i], r = ref[i];
    if (std::isnan(o) || (std::isinf(r) != std::isinf(o)) || (std::isinf(r) && r != o)) {
      if (c.first_bad < 0) c.first_bad = static_cast<int64_t>(i);
      ++c.bad;
      continue;
    }
    if (std::isinf(r)) continue;
    num += (o - r) * (o - r);
    den += r * r;
    c.max_abs = std::max(c.max_abs, std::abs(o - r));
  }
  c.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return c;
}

}  // namespace flexjit::test
