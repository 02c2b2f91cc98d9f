//! The SSD (state space duality) scan of Mamba-2, two ways: chunked over a whole sequence (einsums
//! over static causal masks; the prefill) and as the O(1) recurrence of one step (the decode).
//! The state and the einsums are f32. The decay arithmetic (`A * dt`, its cumulative sums,
//! `segsum` and their exponentials) runs in the dtype of `a`, f32 in the model unless its config's
//! `scan_dtype` says otherwise, and the decays are converted to `x`'s dtype after the `exp`.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{Graph, Tensor};

/// An error of `op` about its argument `arg`.
fn bad_arg(op: &str, arg: &str, why: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("{op}: argument `{arg}` {why}"))
}

/// Checks that the argument `arg` of `op` is a float tensor of shape `want` (described by
/// `names`, say `[b, L, H]`).
fn check_dims(op: &str, arg: &str, t: &Tensor, want: &[usize], names: &str) -> Result<()> {
    if t.dims() != want || !t.dtype().is_float() {
        return Err(bad_arg(
            op,
            arg,
            format!("is {}, expected a float tensor {names} = {want:?}", t.ty()),
        ));
    }
    Ok(())
}

/// The dims `[b, L, H, P]` of `x`, or an error naming it.
fn dims4(op: &str, x: &Tensor) -> Result<[usize; 4]> {
    match *x.dims() {
        [b, l, h, p] if x.dtype().is_float() => Ok([b, l, h, p]),
        _ => Err(bad_arg(
            op,
            "x",
            format!("is {}, expected a float tensor [b, L, H, P]", x.ty()),
        )),
    }
}

/// `N`, the last dimension of `b_` (rank 4), or an error naming it.
fn state_size(op: &str, b_: &Tensor) -> Result<usize> {
    match *b_.dims() {
        [_, _, _, n] => Ok(n),
        _ => Err(bad_arg(
            op,
            "b_",
            format!("is {}, expected [b, L, H, N]", b_.ty()),
        )),
    }
}

/// Checks the arguments of the whole-sequence scans: returns `[b, L, H, P]` and `N`.
fn check_sequence(
    op: &str,
    x: &Tensor,
    dt: &Tensor,
    a: &Tensor,
    b_: &Tensor,
    c: &Tensor,
    init: Option<&Tensor>,
) -> Result<([usize; 4], usize)> {
    let [bs, len, h, p] = dims4(op, x)?;
    let n = state_size(op, b_)?;
    check_dims(op, "dt", dt, &[bs, len, h], "[b, L, H]")?;
    check_dims(op, "a", a, &[h], "[H]")?;
    check_dims(op, "b_", b_, &[bs, len, h, n], "[b, L, H, N]")?;
    check_dims(op, "c", c, &[bs, len, h, n], "[b, L, H, N]")?;
    if let Some(init) = init {
        check_dims(op, "init", init, &[bs, h, p, n], "[b, H, P, N]")?;
    }
    Ok(([bs, len, h, p], n))
}

/// `segsum(x)[..., i, j] = x[..., j+1] + ... + x[..., i]` for `i >= j`, `-inf` above the
/// diagonal, for `x` of shape `[..., T]`: the difference `cs[i] - cs[j]` of one cumulative sum
/// `cs` along `T`, so O(T^2) work per row (a masked cumulative sum over a `T x T` tensor would be
/// O(T^3)).
///
/// Accuracy: the sum and the difference are computed in a wider dtype (f64 for f32 and f64
/// input, f32 for bf16 and f16) and rounded to `x`'s dtype once. For f32 input the result is
/// within half an f32 ulp of the exact value plus `2 T S 2^-53` (`S` the sum of `|x|` along the
/// row), that is, plus at most `6e-10` for `T = 256` and `S = 10^4`: as accurate as an f32
/// segment sum can be. (The masked sequential sum it replaces rounded in f32 at every step.)
pub fn segsum(x: &Tensor) -> Result<Tensor> {
    let g = x.graph();
    let Some(&t) = x.dims().last().filter(|_| x.dtype().is_float()) else {
        return Err(bad_arg(
            "segsum",
            "x",
            format!("is {}, expected a float tensor [..., T]", x.ty()),
        ));
    };
    let wide = match x.dtype() {
        DType::F32 | DType::F64 => DType::F64,
        _ => DType::F32,
    };
    let cs = x.astype(wide)?.cumsum(-1)?;
    // seg[..., i, j] = cs[..., i] - cs[..., j]
    let seg = cs.expand_dims(-1)?.sub(&cs.expand_dims(-2)?)?;
    let seg = seg.astype(x.dtype())?;
    g.tril_mask(t, t, 0)?.select(&seg, f64::NEG_INFINITY)
}

/// Repeats `[b, L, G, N]` group tensors (any leading dimensions; at least `[G, N]`) to
/// `[b, L, H, N]` heads: head `h` reads group `h / (H / G)`. `G` must divide `heads`.
pub fn groups_to_heads(t: &Tensor, heads: usize) -> Result<Tensor> {
    let d = t.dims().to_vec();
    let [.., groups, n] = d[..] else {
        return Err(bad_arg(
            "groups_to_heads",
            "t",
            format!("is {}, expected [..., G, N]", t.ty()),
        ));
    };
    if groups == 0 || heads == 0 || !heads.is_multiple_of(groups) {
        return Err(bad_arg(
            "groups_to_heads",
            "heads",
            format!("({heads}) is not a positive multiple of the {groups} groups of t"),
        ));
    }
    if groups == heads {
        return Ok(t.clone());
    }
    let mut wide = d[..d.len() - 2].to_vec();
    wide.extend([groups, heads / groups, n]);
    let mut out = d[..d.len() - 2].to_vec();
    out.extend([heads, n]);
    let out: Vec<isize> = out.iter().map(|&v| v as isize).collect();
    t.expand_dims(-2)?.broadcast_to(&wide)?.reshape(&out)
}

/// The chunked SSD over a whole sequence. `x`: `[b, L, H, P]`, `dt`: `[b, L, H]` (after softplus,
/// clamp and masking), `a`: `[H]` (negative), `b_`/`c`: `[b, L, H, N]` (already per head),
/// `init`: the state before the sequence, `[b, H, P, N]` (zeros when `None`); `L` a multiple of
/// `chunk` (at least 1). The decays are computed in `a`'s dtype (see the module docs). Returns
/// `y` (`[b, L, H, P]`, without the `D` skip) and the final state `[b, H, P, N]`. A wrong rank,
/// shape or chunk is an error naming the argument.
pub fn ssd_chunked(
    x: &Tensor,
    dt: &Tensor,
    a: &Tensor,
    b_: &Tensor,
    c: &Tensor,
    init: Option<&Tensor>,
    chunk: usize,
) -> Result<(Tensor, Tensor)> {
    let g = x.graph();
    let ([bs, len, h, p], n) = check_sequence("ssd_chunked", x, dt, a, b_, c, init)?;
    if chunk == 0 || !len.is_multiple_of(chunk) {
        return Err(bad_arg(
            "ssd_chunked",
            "chunk",
            format!("({chunk}) is not a positive divisor of the sequence length L = {len}"),
        ));
    }
    let nc = len / chunk;
    let (bs_, nc_, l_, h_, p_, n_) = (
        bs as isize,
        nc as isize,
        chunk as isize,
        h as isize,
        p as isize,
        n as isize,
    );
    // X = x * dt; A = dt * a, per step and head, in the scan dtype.
    let xdt = x.mul(&dt.expand_dims(-1)?)?;
    let adt = dt.astype(a.dtype())?.mul(a)?; // [b, L, H]
    let back = |t: Tensor| t.astype(x.dtype());
    let xc = xdt.reshape(&[bs_, nc_, l_, h_, p_])?;
    let bc = b_.reshape(&[bs_, nc_, l_, h_, n_])?;
    let cc = c.reshape(&[bs_, nc_, l_, h_, n_])?;
    let ac = adt.reshape(&[bs_, nc_, l_, h_])?.transpose(&[0, 3, 1, 2])?; // [b, H, c, l]
    let a_cumsum = ac.cumsum(-1)?;

    // 1. Within each chunk: y_diag = C L B^T X with L = exp(segsum(A)).
    let lmat = back(segsum(&ac)?.exp()?)?; // [b, H, c, l, l]
    let y_diag = Tensor::einsum("bclhn,bcshn,bhcls,bcshp->bclhp", &[&cc, &bc, &lmat, &xc])?;

    // 2. The state each chunk ends with, from its own inputs.
    let last = a_cumsum.narrow(-1, chunk - 1, 1)?; // [b, H, c, 1]
    let decay_states = back(last.sub(&a_cumsum)?.exp()?)?;
    let states = Tensor::einsum("bclhn,bhcl,bclhp->bchpn", &[&bc, &decay_states, &xc])?;

    // 3. Across chunks: carry the states forward, from the initial one.
    let init = match init {
        Some(s) => s.clone(),
        None => g.zeros(DType::F32, &[bs, h, p, n])?,
    };
    let states = Tensor::concat(&[&init.expand_dims(1)?, &states], 1)?; // [b, c+1, H, P, N]
    let last = last.reshape(&[bs_, h_, nc_])?;
    let padded = last.pad(&[0, 0, 1], &[0, 0, 0], &[0, 0, 0], 0.0)?; // [b, H, c+1]
    let decay_chunk = back(segsum(&padded)?.exp()?)?; // [b, H, c+1, c+1]
    let new_states = Tensor::einsum("bhzc,bchpn->bzhpn", &[&decay_chunk, &states])?;
    let states = new_states.narrow(1, 0, nc)?;
    let final_state = new_states.narrow(1, nc, 1)?.reshape(&[bs_, h_, p_, n_])?;

    // 4. Each position's output from the state its chunk started with.
    let decay_out = back(a_cumsum.exp()?)?; // [b, H, c, l]
    let y_off = Tensor::einsum("bclhn,bchpn,bhcl->bclhp", &[&cc, &states, &decay_out])?;
    let y = y_diag.add(&y_off)?.reshape(&[bs_, len as isize, h_, p_])?;
    Ok((y, final_state))
}

/// One step of the recurrence: `h = exp(dt a) h + dt x B`, `y = C h`. `x`: `[b, H, P]`, `dt`:
/// `[b, H]`, `a`: `[H]`, `b_`/`c`: `[b, H, N]`, `state`: `[b, H, P, N]`; `exp(dt a)` is computed in
/// `a`'s dtype. Returns `y` (`[b, H, P]`, without the `D` skip) and the new state. A wrong rank
/// or shape is an error naming the argument.
pub fn ssd_step(
    x: &Tensor,
    dt: &Tensor,
    a: &Tensor,
    b_: &Tensor,
    c: &Tensor,
    state: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let op = "ssd_step";
    let [bs, h, p] = match *x.dims() {
        [bs, h, p] if x.dtype().is_float() => [bs, h, p],
        _ => {
            return Err(bad_arg(
                op,
                "x",
                format!("is {}, expected a float tensor [b, H, P]", x.ty()),
            ))
        }
    };
    let n = match *b_.dims() {
        [_, _, n] => n,
        _ => {
            return Err(bad_arg(
                op,
                "b_",
                format!("is {}, expected [b, H, N]", b_.ty()),
            ))
        }
    };
    check_dims(op, "dt", dt, &[bs, h], "[b, H]")?;
    check_dims(op, "a", a, &[h], "[H]")?;
    check_dims(op, "b_", b_, &[bs, h, n], "[b, H, N]")?;
    check_dims(op, "c", c, &[bs, h, n], "[b, H, N]")?;
    check_dims(op, "state", state, &[bs, h, p, n], "[b, H, P, N]")?;
    let decay = dt.astype(a.dtype())?.mul(a)?.exp()?.astype(x.dtype())?;
    let decay = decay.expand_dims(-1)?.expand_dims(-1)?; // [b, H, 1, 1]
    let xdt = x.mul(&dt.expand_dims(-1)?)?; // [b, H, P]
    let input = xdt.expand_dims(-1)?.mul(&b_.expand_dims(2)?)?; // [b, H, P, N]
    let new_state = state.mul(&decay)?.add(&input)?;
    let y = Tensor::einsum("bhpn,bhn->bhp", &[&new_state, c])?;
    Ok((y, new_state))
}

/// The naive recurrence over a whole sequence, one [`ssd_step`] per position inside a
/// `fori_loop`: the reference the chunked form is tested against. Arguments as in
/// [`ssd_chunked`], with the initial state `init` required.
pub fn ssd_recurrent(
    x: &Tensor,
    dt: &Tensor,
    a: &Tensor,
    b_: &Tensor,
    c: &Tensor,
    init: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let g: &Graph = x.graph();
    let ([bs, len, h, p], n) = check_sequence("ssd_recurrent", x, dt, a, b_, c, Some(init))?;
    let y0 = g.zeros(DType::F32, &[bs, len, h, p])?;
    let zero = g.scalar(0.0, DType::I64)?;
    let (y, state) = g.fori_loop(0, len, &(y0, init.clone()), |t, (y, state)| {
        let at = |v: &Tensor, width: &[usize]| -> Result<Tensor> {
            let mut starts: Vec<&Tensor> = vec![&zero, t];
            starts.extend(std::iter::repeat_n(&zero, v.rank() - 2));
            let mut sizes = vec![bs, 1];
            sizes.extend_from_slice(width);
            let mut squeezed: Vec<isize> = vec![bs as isize];
            squeezed.extend(width.iter().map(|&w| w as isize));
            v.dynamic_slice(&starts, &sizes)?.reshape(&squeezed)
        };
        let (yt, next) = ssd_step(
            &at(x, &[h, p])?,
            &at(dt, &[h])?,
            a,
            &at(b_, &[h, n])?,
            &at(c, &[h, n])?,
            state,
        )?;
        let y = y.dynamic_update_slice(&yt.expand_dims(1)?, &[&zero, t, &zero, &zero])?;
        Ok((y, next))
    })?;
    Ok((y, state))
}
