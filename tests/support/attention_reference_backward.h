// A float64 reference of the flex attention backward for tests: naive loops over every
// (b, h, q, kv), the mods and their derivatives (differentiate_score_mod) evaluated with the
// interpreter, parallel over rows. Independent of every back end.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#include "compiler/interpreter.h"
#include "compiler/passes/autodiff.h"
#include "compiler/passes/row_constant_scatters.h"
#include "compiler/spec_ir.h"
#include "support/attention_reference.h"

namespace flexjit::test {

struct RefBackward {
  std::vector<double> dq;  // [B,H,Sq,D]
  std::vector<double> dk;  // [B,Hkv,Skv,D]  (summed over the query heads of each KV head)
  std::vector<double> dv;  // [B,Hkv,Skv,Dv]
  std::vector<std::vector<double>> grads;  // per spec buffer (spec order): flat, the buffer's shape (contiguous); empty unless the buffer requires_grad
};

// The flat offset in a contiguous array of `shape` that a load at `index` reads: each index
// in [-n, -1] wraps, anything else outside [0, n) clamps (docs/SEMANTICS.md).
inline int64_t resolve_load_offset(const std::vector<int64_t>& shape, const std::vector<int64_t>& index) {
  int64_t off = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t n = shape[d], i = index[d];
    if (i < 0 && i >= -n) i += n;
    i = std::clamp<int64_t>(i, 0, n - 1);
    off = off * n + i;
  }
  return off;
}

// o [B,H,Sq,Dv] and lse [B,H,Sq] are the forward results to use (e.g. from
// reference_attention, or merged ones); d_o [B,H,Sq,Dv]. scale: softmax scale applied
// before score_mod. Per row: s_j = score_mod(scale q.k_j) (masked: -inf), P_j = exp(s_j - lse),
// dS_j = P_j (dO.v_j - dO.o) is the gradient with respect to the modded score; dS_j * d_score
// flows into q and k, dS_j * coefficient into each scatter's buffer element. batch_offset: the b the mods see for
// batch 0 (one sequence of a ragged batch).
inline RefBackward reference_backward(const SpecIR& ir, const RefShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                      const std::vector<float>& v, const std::vector<float>& d_o, const std::vector<double>& o,
                                      const std::vector<double>& lse, const EvalEnv& base_env, double scale, int64_t batch_offset = 0) {
  ScoreModGradient grad = differentiate_score_mod(ir);
  // A scatter constant along the row adds c(q) * rowsum(dS), which is exactly 0: with the o given here (a kernel's
  // bf16 output) the loops below would add the cancellation noise of D = dO.o instead (row_constant_scatters.h).
  drop_row_constant_scatters(grad);
  const size_t nbuf = ir.spec().buffers.size();
  RefBackward r;
  r.dq.assign(static_cast<size_t>(s.B * s.H * s.Sq * s.D), 0.0);
  r.dk.assign(static_cast<size_t>(s.B * s.Hkv * s.Skv * s.D), 0.0);
  r.dv.assign(static_cast<size_t>(s.B * s.Hkv * s.Skv * s.Dv), 0.0);
  r.grads.resize(nbuf);
  std::vector<std::vector<int64_t>> shapes(nbuf);
  for (size_t i = 0; i < nbuf; ++i) {
    if (!ir.spec().buffers[i].requires_grad || i >= base_env.buffers.size()) continue;
    shapes[i] = base_env.buffers[i].shape;
    int64_t n = 1;
    for (int64_t e : shapes[i]) n *= e;
    r.grads[i].assign(static_cast<size_t>(n), 0.0);
  }
  // dk, dv and the buffer gradients receive contributions from many rows: each thread sums
  // into its own copy, and the copies are added in thread order at the end.
  struct Partial {
    std::vector<double> dk, dv;
    std::vector<std::vector<double>> grads;
  };
  const int64_t rows = s.B * s.H * s.Sq;
  int threads = static_cast<int>(std::max(1u, std::min(32u, std::thread::hardware_concurrency())));
  std::vector<Partial> parts(static_cast<size_t>(threads));
  auto work = [&](Partial& part, int64_t first, int64_t last) {
    part.dk.assign(r.dk.size(), 0.0);
    part.dv.assign(r.dv.size(), 0.0);
    part.grads.resize(nbuf);
    for (size_t i = 0; i < nbuf; ++i) part.grads[i].assign(r.grads[i].size(), 0.0);
    EvalEnv env = base_env;
    std::vector<int64_t> index;
    for (int64_t row = first; row < last; ++row) {
      const double row_lse = lse[static_cast<size_t>(row)];
      if (row_lse == -std::numeric_limits<double>::infinity()) continue;  // fully masked: P = 0 everywhere
      int64_t b = row / (s.H * s.Sq), h = (row / s.Sq) % s.H, qi = row % s.Sq;
      int64_t hkv = h / (s.H / s.Hkv);
      const float* qp = &q[static_cast<size_t>(row * s.D)];
      const float* dop = &d_o[static_cast<size_t>(row * s.Dv)];
      const double* op = &o[static_cast<size_t>(row * s.Dv)];
      double* dqp = &r.dq[static_cast<size_t>(row * s.D)];
      double di = 0;
      for (int64_t d = 0; d < s.Dv; ++d) di += double(dop[d]) * op[d];
      env.vars[int(dsl::VarId::B)] = b + batch_offset;
      env.vars[int(dsl::VarId::H)] = h;
      env.vars[int(dsl::VarId::KvHead)] = hkv;
      env.vars[int(dsl::VarId::Q)] = qi;
      for (int64_t kv = 0; kv < s.Skv; ++kv) {
        env.vars[int(dsl::VarId::KV)] = kv;
        if (ir.mask_mod && !evaluate(ir.mask_mod, env).b) continue;
        const size_t kv_row = static_cast<size_t>((b * s.Hkv + hkv) * s.Skv + kv);
        const float* kp = &k[kv_row * static_cast<size_t>(s.D)];
        const float* vp = &v[kv_row * static_cast<size_t>(s.Dv)];
        double dot = 0;
        for (int64_t d = 0; d < s.D; ++d) dot += double(qp[d]) * double(kp[d]);
        double sc = dot * scale;
        env.score = static_cast<float>(sc);
        if (ir.score_mod) sc = evaluate(ir.score_mod, env).f;
        double p = std::exp(sc - row_lse);
        if (p == 0) continue;  // dS = 0: nothing flows anywhere
        double dp = 0;
        for (int64_t d = 0; d < s.Dv; ++d) dp += double(dop[d]) * double(vp[d]);
        double ds = p * (dp - di);
        double dpre = ds * double(evaluate(grad.d_score, env).f);
        for (int64_t d = 0; d < s.D; ++d) {
          dqp[d] += scale * dpre * double(kp[d]);
          part.dk[kv_row * static_cast<size_t>(s.D) + static_cast<size_t>(d)] += scale * dpre * double(qp[d]);
        }
        for (int64_t d = 0; d < s.Dv; ++d) part.dv[kv_row * static_cast<size_t>(s.Dv) + static_cast<size_t>(d)] += p * double(dop[d]);
        for (const GradScatter& sc_term : grad.scatters) {
          const size_t bi = static_cast<size_t>(sc_term.buffer);
          if (part.grads[bi].empty()) continue;
          index.clear();
          for (const ir::Expr& e : sc_term.indices) index.push_back(evaluate(e, env).i);
          double coef = evaluate(sc_term.coefficient, env).f;
          part.grads[bi][static_cast<size_t>(resolve_load_offset(shapes[bi], index))] += ds * coef;
        }
      }
    }
  };
  std::vector<std::thread> pool;
  int64_t chunk = (rows + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    int64_t a = t * chunk, e = std::min(rows, a + chunk);
    if (a < e) pool.emplace_back(work, std::ref(parts[static_cast<size_t>(t)]), a, e);
  }
  for (auto& th : pool) th.join();
  for (const Partial& part : parts) {
    for (size_t i = 0; i < part.dk.size(); ++i) r.dk[i] += part.dk[i];
    for (size_t i = 0; i < part.dv.size(); ++i) r.dv[i] += part.dv[i];
    for (size_t b = 0; b < part.grads.size(); ++b)
      for (size_t i = 0; i < part.grads[b].size(); ++i) r.grads[b][i] += part.grads[b][i];
  }
  return r;
}

}  // namespace flexjit::test
