"""A token-by-token numpy (float64) reference of the GDN mixer, for tests only.

Written independently of gdn.py's chunked math: a plain loop over rows and tokens that keeps
the conv window as a list of the last Kc-1 valid pre-conv inputs and updates the recurrent
state with the gated delta rule one token at a time (transformers' recurrent form).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _l2n(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def gdn_mix_reference(
    p: dict[str, Any],
    h_BLD: Any,
    cfg: Any,
    *,
    state: Any = None,
    valid_BL: Any = None,
    reset_BL: Any = None,
    cross_h_BLD: Any = None,
    cross_so: tuple[Any, Any] | None = None,
    cross_silu: bool = True,
) -> tuple[np.ndarray, np.ndarray | None, dict[str, np.ndarray]]:
    """Same contract as gdn.gdn_mix, computed token by token in float64.

    state: a GDNState (or anything with conv_q/conv_k/conv_v/recurrent) or None. Returns
    (y [B, L, D], cross_y [B, L, D] or None, state as a dict of float64 arrays).
    """
    f = {n: np.asarray(x, np.float64) for n, x in p.items()}
    h = np.asarray(h_BLD, np.float64)
    b, seq, d = h.shape
    hk, hv, dk, dv = (
        cfg.gdn_num_k_heads,
        cfg.gdn_num_v_heads,
        cfg.gdn_k_head_dim,
        cfg.gdn_v_head_dim,
    )
    kc, grp = cfg.gdn_conv_kernel, hv // hk
    valid = np.ones((b, seq), bool) if valid_BL is None else np.asarray(valid_BL, bool)
    reset = np.zeros((b, seq), bool) if reset_BL is None else np.asarray(reset_BL, bool)
    cross = None if cross_h_BLD is None else np.asarray(cross_h_BLD, np.float64)
    w_in = np.concatenate([f[f"gdn_w{k}"].reshape(d, -1) for k in "qkv"], axis=1)  # [D, C]
    w_conv = np.concatenate([f[f"gdn_conv_{k}"].reshape(kc, -1) for k in "qkv"], axis=1)
    qd = hk * dk

    if state is None:
        hist0 = np.zeros((b, kc - 1, w_in.shape[1]))
        rec0 = np.zeros((b, hv, dk, dv))
    else:
        hist0 = np.concatenate(
            [
                np.asarray(getattr(state, f"conv_{k}"), np.float64).reshape(b, kc - 1, -1)
                for k in "qkv"
            ],
            axis=-1,
        )
        rec0 = np.asarray(state.recurrent, np.float64)

    def finish(o: np.ndarray, x: np.ndarray) -> np.ndarray:
        z = (x @ f["gdn_wz"].reshape(d, -1)).reshape(hv, dv)
        normed = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + cfg.norm_eps)
        gated = normed * f["gdn_norm"] * _silu(z)
        return gated.reshape(-1) @ f["gdn_out"].reshape(-1, d)

    y = np.zeros((b, seq, d))
    cross_y = None if cross is None else np.zeros((b, seq, d))
    hist_out = np.zeros_like(hist0)
    rec_out = np.zeros_like(rec0)
    for r in range(b):
        window = [hist0[r, i] for i in range(kc - 1)]
        s = rec0[r].copy()
        for t in range(seq):
            if not valid[r, t]:
                continue
            if reset[r, t]:
                window = [np.zeros_like(w) for w in window]
                s = np.zeros_like(s)
            x = h[r, t]
            window.append(x @ w_in)
            mixed = _silu(sum(w_conv[i] * window[i] for i in range(kc)))
            window = window[1:]
            q = _l2n(mixed[:qd].reshape(hk, dk)) / np.sqrt(dk)
            k = _l2n(mixed[qd : 2 * qd].reshape(hk, dk))
            v = mixed[2 * qd :].reshape(hv, dv)
            beta = 1.0 / (1.0 + np.exp(-(x @ f["gdn_wb"])))
            g = -np.exp(f["gdn_a_log"]) * np.logaddexp(0.0, x @ f["gdn_wa"] + f["gdn_dt_bias"])
            o = np.zeros((hv, dv))
            for j in range(hv):
                kj = k[j // grp]
                s[j] = np.exp(g[j]) * s[j]
                s[j] = s[j] + beta[j] * np.outer(kj, v[j] - kj @ s[j])
                o[j] = q[j // grp] @ s[j]
            y[r, t] = finish(o, x)
            if cross is not None:
                xc = cross[r, t]
                qc = (xc @ f["gdn_wq"].reshape(d, -1)).reshape(hk, dk)
                if cross_silu:
                    qc = _silu(qc)
                if cross_so is not None:
                    qc = qc * np.asarray(cross_so[0], np.float64) + np.asarray(
                        cross_so[1], np.float64
                    )
                qc = _l2n(qc) / np.sqrt(dk)
                oc = np.stack([qc[j // grp] @ s[j] for j in range(hv)])
                cross_y[r, t] = finish(oc, xc)
        hist_out[r] = np.stack(window) if kc > 1 else hist_out[r]
        rec_out[r] = s
    sizes = np.cumsum([qd, qd])
    cq, ck, cv = np.split(hist_out, sizes, axis=-1)
    new_state = {
        "conv_q": cq.reshape(b, kc - 1, hk, dk),
        "conv_k": ck.reshape(b, kc - 1, hk, dk),
        "conv_v": cv.reshape(b, kc - 1, hv, dv),
        "recurrent": rec_out,
    }
    return y, cross_y, new_state
