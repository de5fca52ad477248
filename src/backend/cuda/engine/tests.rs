//! The engine's tests that need no GPU: the kernel source against the Rust side's constants
//! and argument structs, index arithmetic, and step checks.

use super::args::*;
use super::kernels::*;
use super::steps;
use crate::backend::cuda::plan::{
    Act, DType, EwOp, Layout, MAX_RANK, Operand, PadMode, Plan, ReduceOp, Step, TensorDesc,
};

fn tensor(name: &str, shape: &[usize], layout: Layout) -> TensorDesc {
    TensorDesc {
        name: name.into(),
        shape: shape.to_vec(),
        layout,
        dtype: DType::F32,
        scale: 1.0,
        alias_of: None,
    }
}

fn plan_of(tensors: Vec<TensorDesc>) -> Plan {
    Plan {
        tensors,
        ..Default::default()
    }
}

/// The kernels compile under NVRTC for Hopper (sm_90a, with its warpgroup kernels, and plain
/// sm_90) and for the oldest supported GPU, without a warning, and export every kernel the
/// engine loads. Needs no GPU: NVRTC alone (the `nvidia-cuda-nvrtc` and
/// `nvidia-cuda-runtime` wheels for CUDA 13, with QUANTSCOPE_CUDA_LIB_DIRS naming the folder
/// that holds libnvrtc.so.13; .ci/run does this).
/// Skips when NVRTC is missing, unless QUANTSCOPE_REQUIRE_NVRTC is set.
#[test]
fn kernels_compile_with_nvrtc() {
    let _ = super::super::libs::preload();
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        // CI installs the wheels and sets this, so a broken install fails instead of skipping.
        assert!(
            std::env::var_os("QUANTSCOPE_REQUIRE_NVRTC").is_none(),
            "QUANTSCOPE_REQUIRE_NVRTC is set but libnvrtc.so.13 cannot be loaded"
        );
        eprintln!(
            "skipped: NVRTC (libnvrtc.so.13) cannot be loaded; install the nvidia-cuda-nvrtc \
             wheel and set {} to its lib folder",
            super::super::libs::ENV_DIRS
        );
        return;
    }
    for arch in ["compute_90a", "compute_90", "compute_75"] {
        let (ptx, log) = compile_kernels(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(log.trim().is_empty(), "{arch}: NVRTC warnings:\n{log}");
        for name in KERNEL_NAMES {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "{arch}: kernel `{name}` missing from the PTX"
            );
        }
        // Every kernel launches as a programmatic dependent launch on sm_90 (`Kernel`), which
        // is safe only if each waits for the kernel before it: each entry's code has the
        // wait (none on older GPUs, whose PTX has no such instruction).
        let entries: Vec<&str> = ptx.split(".entry ").skip(1).collect();
        assert_eq!(entries.len(), KERNEL_NAMES.len(), "{arch}");
        for body in entries {
            let name = body.split('(').next().unwrap_or_default();
            assert_eq!(
                body.contains("griddepcontrol.wait"),
                arch != "compute_75",
                "{arch}: kernel `{name}` and griddepcontrol.wait"
            );
            // Hopper's warpgroup instructions exist on the sm_90a target alone; elsewhere
            // the `conv_i8_wgmma` kernels are traps, and no other kernel uses them.
            assert_eq!(
                body.contains("wgmma.mma_async"),
                arch == "compute_90a" && name.starts_with("conv_i8_wgmma"),
                "{arch}: kernel `{name}` and wgmma"
            );
        }
        eprintln!(
            "{arch}: {} kernels, {} bytes of PTX",
            KERNEL_NAMES.len(),
            ptx.len()
        );
    }
}

/// The argument structs keep kernels/common.cuh's C layout: each field at the offset the
/// kernel reads it from (a struct without `#[repr(C)]` may be reordered by the compiler).
#[test]
fn argument_structs_keep_the_c_layout() {
    use std::mem::offset_of;
    let r = MAX_RANK * 8;
    assert_eq!(
        [
            offset_of!(ViewArgs, strides),
            offset_of!(ViewArgs, offset),
            offset_of!(ViewArgs, rank)
        ],
        [r, 2 * r, 2 * r + 8]
    );
    assert_eq!(offset_of!(ViewArgs, div), 2 * r + 16);
    assert_eq!(
        [
            offset_of!(NaryArgs, strides),
            offset_of!(NaryArgs, ptrs),
            offset_of!(NaryArgs, t)
        ],
        [r, 4 * r, 4 * r + 24]
    );
    assert_eq!(offset_of!(NaryArgs, div), 4 * r + 56);
    assert_eq!(offset_of!(PadArgs, div), 3 * r + 8);
    assert_eq!(offset_of!(FastDiv, shift), MAX_RANK * 4);
}

#[test]
fn argument_structs_match_kernels_cu() {
    // i64 arrays then ints, padded to 8 bytes, then the FastDiv's two u32 arrays, as the
    // C++ compiler lays them out.
    let div = 2 * 4 * 8;
    assert_eq!(std::mem::size_of::<FastDiv>(), div);
    assert_eq!(std::mem::size_of::<ViewArgs>(), 8 * 8 * 2 + 8 + 8 + div);
    assert_eq!(
        std::mem::size_of::<NaryArgs>(),
        8 * 8 * 4 + 3 * 8 + 3 * 4 * 2 + 8 + div
    );
    assert_eq!(std::mem::size_of::<PadArgs>(), 8 * 8 * 3 + 8 + div);
    for src in [
        "struct ViewArgs",
        "struct NaryArgs",
        "struct PadArgs",
        "struct FastDiv",
        "  FastDiv div;\n};",
    ] {
        assert!(KERNELS.contains(src), "{src}");
    }
    assert!(KERNELS.contains(&format!("#define QS_MAX_RANK {MAX_RANK}")));
    // The tensor map the streaming wgmma kernel takes by value: a CUtensorMap's 128 bytes,
    // 64-byte aligned, as the kernel's TmaMap and cudarc's CUtensorMap are.
    assert_eq!(std::mem::size_of::<TensorMap>(), 128);
    assert_eq!(std::mem::align_of::<TensorMap>(), 64);
    assert_eq!(
        std::mem::size_of::<TensorMap>(),
        std::mem::size_of::<cudarc::driver::sys::CUtensorMap>()
    );
    assert!(KERNELS.contains("struct __align__(64) TmaMap {\n  unsigned long long v[16];\n};"));
}

/// The host's copies of the tensor-core kernel's tile constants and launch bounds are the
/// kernel's: the launch's dynamic shared memory (`mma_smem_bytes`) is sized from them (a
/// smaller size than the kernel's layout would let its copies write past the block's
/// share), and whether the residual tile gets room from the blocks an SM they ask for. The
/// int8 GEMV kernel's rows and block size too (its grid is sized from them).
#[test]
fn tensor_core_tile_constants_match_the_kernels() {
    for (name, v) in [
        ("MMA_BM", MMA_BM),
        ("MMA_BN", MMA_BN),
        ("MMA_BK", MMA_BK),
        ("MMA_STAGES", MMA_STAGES),
        ("MMA_THREADS", MMA_THREADS),
        ("WG_BM", WG_BM),
        ("WG_BK", WG_BK),
        ("WG_STAGES", WG_STAGES),
        ("GV_MAX_M", GV_MAX_M),
        ("GV_THREADS", GV_THREADS),
        ("WGS_BM", WGS_BM),
        ("WGS_MAX_KPAD", WGS_MAX_KPAD),
        ("WGS_MAX_STAGES", WGS_MAX_STAGES),
        ("WGS_MAX_BLOCKS", WGS_MAX_BLOCKS),
    ] {
        assert!(
            KERNELS.contains(&format!("#define {name} {v}\n")),
            "{name} {v}"
        );
    }
    // The launch bounds' blocks an SM fit sm_90's 228 KiB (the driver keeps 1 KiB a block).
    let bounds = [
        ("MMA_THREADS, 2) conv_i8_wgmma(", 2),
        ("MMA_THREADS, 3) conv_i8_wgmma64(", 3),
        ("2 * MMA_THREADS, 1) conv_i8_wgmma_wide(", 1),
    ];
    for ((bm, bn), (b, blocks)) in WGMMA_TILES.into_iter().zip(bounds) {
        assert!(KERNELS.contains(&format!("__launch_bounds__({b}")), "{b}");
        assert!(
            blocks * (wgmma_smem_bytes(bm, bn) + 1024) <= 228 << 10,
            "{bm} x {bn}"
        );
    }
    assert_eq!(ptx_arch((9, 0)), "compute_90a");
    assert_eq!(ptx_arch((8, 6)), "compute_86");
    assert_eq!(ptx_arch((10, 0)), "compute_100");
    assert!(KERNELS.contains("#define MMA_LD (MMA_BK + 16)\n"));
    assert!(KERNELS.contains(&format!("#define ROWS_MAX_OW {ROWS_MAX_OW}\n")));
    assert!(KERNELS.contains("#define ROWS_CODE_LD (MMA_BN + 16)\n"));
    assert_eq!(ROWS_CODE_LD, MMA_BN + 16);
    // The host's `epi_i8_ok` (and `rows_codes`, which sizes the row kernel's shared memory)
    // against the kernel's `epi_i8_ok`: the same outputs, residuals and activations.
    assert!(KERNELS.contains(
        "return y_t == 2 && (res_t < 0 || res_t == 2) && (act <= 2 || act == 4 || act == 24);"
    ));
    for act in [
        Act::None,
        Act::Relu,
        Act::Clip(0.0, 6.0),
        Act::Silu,
        Act::Sigmoid,
        Act::HardSwish,
        Act::LeakyRelu(0.1),
        Act::Gelu,
    ] {
        let code = act.code().0;
        for out in [DType::I8, DType::F16, DType::F32] {
            for residual in [false, true] {
                assert_eq!(
                    rows_codes(out, residual, act),
                    out == DType::I8 && !residual && (code <= 2 || code == 4 || code == 24),
                    "{act:?} {out:?} {residual}"
                );
            }
            // The streaming 1x1 kernels' condition, residual types as the kernel's codes.
            for res in [None, Some(DType::I8), Some(DType::F16), Some(DType::F32)] {
                let res_t = res.map_or(-1, |d| d.code());
                assert_eq!(
                    epi_i8_ok(out, res, act),
                    out.code() == 2
                        && (res_t < 0 || res_t == 2)
                        && (code <= 2 || code == 4 || code == 24),
                    "{act:?} {out:?} {res:?}"
                );
            }
        }
    }
    // ResNet-50's regrouped stem (4x4 taps of 16 channels, rows of 112 pixels): five
    // blocks an sm_90 SM with the int8 epilogue in registers, three staging int32 sums.
    for (codes, blocks) in [(true, 5), (false, 3)] {
        let stem = rows_smem_bytes(256, 4, 4, 112, codes);
        assert!(
            stem <= ROWS_MAX_SMEM && blocks * (stem + 1024) <= 228 << 10,
            "{stem}"
        );
    }
    for (bm, blocks) in MMA_OCCUPANCY {
        let bounds = format!("__launch_bounds__(MMA_THREADS, {blocks})");
        let body = format!(
            "conv_i8_mma_body<{}>",
            if bm == MMA_BM { "MMA_BM" } else { "MMA_BM / 2" }
        );
        // The kernel with those bounds runs that tile height.
        let at = KERNELS.find(&bounds).unwrap_or_else(|| panic!("{bounds}"));
        let end = at + KERNELS[at..].find("\n}\n").expect("kernel end");
        assert!(KERNELS[at..end].contains(&body), "{bounds} {body}");
    }
    // An sm_90 SM (228 KiB) keeps the launch bounds' occupancy with the residual tile; the
    // 100 KiB of sm_86 / sm_89 do without it (two 128-pixel blocks, three 64-pixel ones).
    assert!(mma_residual_fits(228 << 10));
    assert!(!mma_residual_fits(100 << 10));
    assert!(2 * (mma_smem_bytes(MMA_BM, false) + 1024) <= 100 << 10);
    assert!(3 * (mma_smem_bytes(MMA_BM / 2, false) + 1024) <= 100 << 10);
    // The streaming 1x1 kernels: the kernel finds its alphas past the weights and the two
    // x and code tiles, as `mmas_smem_bytes` counts them; at reduction 64 an sm_90 SM
    // holds the blocks their launch bounds ask for (four 128-pixel, six 64-pixel); within
    // MMAS_MAX_SMEM the 128-pixel tiles run up to reduction 128, the 64-pixel ones to 256.
    assert!(KERNELS.contains("(smem + MMA_BN * ld + 2 * BM * (ld + ROWS_CODE_LD))"));
    for ((bm, blocks), kernel) in MMA_OCCUPANCY
        .into_iter()
        .zip(["conv_i8_mmas", "conv_i8_mmas64"])
    {
        let decl = format!("__launch_bounds__(MMA_THREADS, {blocks}) {kernel}(");
        assert!(KERNELS.contains(&decl), "{decl}");
        assert!(
            blocks * (mmas_smem_bytes(bm, 64) + 1024) <= 228 << 10,
            "{bm}"
        );
    }
    for (bm, kpad, fits) in [
        (MMA_BM, 128, true),
        (MMA_BM, 256, false),
        (MMA_BM / 2, 256, true),
    ] {
        assert_eq!(
            mmas_smem_bytes(bm, kpad) <= MMAS_MAX_SMEM,
            fits,
            "{bm} {kpad}"
        );
    }
    assert_eq!(MMAS_KPADS.map(|k| MMA_THREADS % (k / 16)), [0; 3]);
    // The streaming wgmma kernel (its constants are checked above): its alphas past the
    // weights, the stages and the code tiles as `wgs_smem_bytes` counts them, and its launch
    // bounds' WGS_MAX_BLOCKS blocks an SM.
    assert!(KERNELS.contains(
        "    xt = (kpad + WG_BK - 1) / WG_BK * WGS_BM * WG_BK;
    stage = window > 0 ? WGS_BM * window : xt + WGS_BM * MMA_BN;
    code = xt + stages * stage;
    alpha = code + 2 * WGS_BM * ROWS_CODE_LD;
    bar = alpha + 2 * MMA_BN * 4;
"
    ));
    assert!(
        KERNELS
            .contains("__launch_bounds__(MMA_THREADS, WGS_MAX_BLOCKS)\n    conv_i8_wgmma_stream(")
    );
}

/// A tensor map the driver would refuse, or one whose copies would not land where the kernel
/// reads them, is an error before the driver is asked: a start, a row or a row's stride not
/// 16-byte aligned, no rows, a box row wider than its swizzle's period, a box of more than
/// 256 rows.
#[test]
fn tensor_maps_refuse_what_the_driver_and_kernel_cannot_take() {
    let bad = [
        (8, [64, 64], 10, [128, 64], Swizzle::B128),
        (256, [40, 40], 10, [128, 64], Swizzle::B128),
        (256, [64, 24], 10, [64, 64], Swizzle::B64),
        (256, [64, 0], 10, [64, 64], Swizzle::B64),
        (256, [64, 64], 0, [128, 64], Swizzle::B128),
        (256, [64, 64], 10, [128, 64], Swizzle::B64),
        (256, [64, 64], 10, [128, 512], Swizzle::B128),
    ];
    for (ptr, row_bytes, rows, boxes, swizzle) in bad {
        let err = TensorMap::rows(ptr, row_bytes, rows, boxes, swizzle)
            .expect_err("refused before the driver call");
        assert!(
            err.to_string().contains("tensor map of"),
            "{ptr} {row_bytes:?} {rows} {boxes:?}: {err}"
        );
    }
}

/// The streaming wgmma kernel's plans on an sm_90 SM (228 KiB, 227 a block): ResNet-50's
/// expansions (reductions 64 to 512 bytes) and reductions (256 to 1,024) get the most blocks
/// an SM that two stages fit, then fewer blocks of more stages; the weights of a 2,048-byte
/// reduction and two stages do not fit. Its regrouped stem (a 4 x 4 conv of 16 channels:
/// 64-byte window rows, four filter rows) keeps 7 window boxes at four blocks an SM, 11 at
/// three and 16 at two; a 4 x 4 conv of 32 channels (128-byte rows) keeps 8 at two blocks and
/// 16 at one (six, its fewest, do not fit three). Every plan fits the block's share of the SM
/// and the kernel's limit, and a stage more would not.
#[test]
fn streaming_wgmma_plans_fit_the_sm() {
    let sm90 = 228 << 10;
    let tiles = |kpad| wgs_plans(kpad, wgs_tile_stage(kpad), 2..=WGS_MAX_STAGES, sm90);
    assert_eq!(tiles(64), [(4, 3), (3, 4), (2, 6)]);
    assert_eq!(tiles(128), [(4, 3), (3, 4), (2, 6)]);
    assert_eq!(tiles(256), [(3, 2), (2, 4), (1, 6)]);
    assert_eq!(tiles(512), [(1, 5)]);
    assert_eq!(tiles(1024), [(1, 2)]);
    assert_eq!(tiles(2048), []);
    let windows = |kpad, window: usize| wgs_plans(kpad, 64 * window, 6..=WGS_MAX_WINDOWS, sm90);
    assert_eq!(windows(256, 64), [(4, 7), (3, 11), (2, 16)]);
    assert_eq!(windows(512, 128), [(2, 8), (1, 16)]);
    let stages = [(2, WGS_MAX_STAGES), (6, WGS_MAX_WINDOWS)];
    for kpad in (64..=WGS_MAX_KPAD).step_by(64) {
        for (stage, (fewest, most)) in [wgs_tile_stage(kpad), 64 * 64].into_iter().zip(stages) {
            for (blocks, n) in wgs_plans(kpad, stage, fewest..=most, sm90) {
                let smem = wgs_smem_bytes(kpad, stage, n);
                assert!(smem <= WGS_MAX_SMEM, "{kpad}");
                assert!(blocks * (smem + 1024) <= sm90, "{kpad} {blocks}");
                assert!(
                    n == most || blocks * (wgs_smem_bytes(kpad, stage, n + 1) + 1024) > sm90,
                    "{kpad} {blocks} {n}"
                );
            }
        }
    }
}

/// `nary4`, `nary8` and `nary16` take an NHWC tensor times a per-channel gate (one vector
/// read each per group, the gate's too) and a per-pixel scalar operand (one read a group),
/// and leave a channel count that is not whole groups, an input whose rows do not start on
/// a group, or an input that steps across the innermost dim, to a narrower kernel or `nary`.
#[test]
fn nary_groups_only_where_every_input_reads_whole_groups() {
    let args = |dims: &[i64], strides: &[&[i64]]| {
        let mut a = NaryArgs {
            rank: dims.len() as i32,
            nin: strides.len() as i32,
            ..Default::default()
        };
        a.dims[..dims.len()].copy_from_slice(dims);
        for (k, s) in strides.iter().enumerate() {
            a.strides[k][..s.len()].copy_from_slice(s);
        }
        a.div = FastDiv::of(&a.dims[..dims.len()]);
        a
    };
    let gated = args(&[2, 36, 32], &[&[1152, 32, 1], &[32, 0, 1]]);
    for (width, groups) in [(4, 8), (8, 4), (16, 2)] {
        let (g, vec) = nary_groups(&gated, width).expect("grouped");
        assert_eq!(vec, 0b11);
        assert_eq!(&g.dims[..3], &[2, 36, groups]);
        assert_eq!(
            (&g.strides[0][..3], &g.strides[1][..3]),
            (&[1152, 32, width][..], &[32, 0, width][..])
        );
        assert_eq!(
            fast_quotient(&g.div, 2, 7),
            7 / groups as u32,
            "divides by the group count"
        );
    }
    let (_, vec) =
        nary_groups(&args(&[2, 36, 8], &[&[288, 8, 1], &[36, 1, 0]]), 4).expect("grouped");
    assert_eq!(vec, 0b01, "the per-pixel operand is read once per group");
    assert!(
        nary_groups(&args(&[2, 36, 8], &[&[288, 8, 1]]), 16).is_none(),
        "8 channels"
    );
    assert!(
        nary_groups(&args(&[2, 36, 16], &[&[580, 16, 1]]), 16).is_none(),
        "images 580 elements apart"
    );
    assert!(nary_groups(&args(&[2, 36, 6], &[&[216, 6, 1]]), 4).is_none());
    assert!(nary_groups(&args(&[8, 36], &[&[1, 8]]), 4).is_none());
    assert!(
        nary_groups(&args(&[3, 8], &[&[10, 1]]), 4).is_none(),
        "rows of 10"
    );
}

/// The kernels' `next_idx_fast`: umulhi(n, magic) >> shift, on the host.
fn fast_quotient(f: &FastDiv, k: usize, n: u32) -> u32 {
    if f.magic[k] == 0 {
        n
    } else {
        ((n as u64 * f.magic[k] as u64) >> 32) as u32 >> f.shift[k]
    }
}

#[test]
fn fast_division_is_exact_below_2_pow_31() {
    let divisors: Vec<i64> = (1..=300)
        .chain([511, 512, 513, 3 * 224 * 224, 12544, 65535, 65536, 1 << 20])
        .chain([(1 << 30) + 1, (1 << 31) - 1, 1 << 31])
        .collect();
    let mut seed = 1u64;
    for chunk in divisors.chunks(MAX_RANK) {
        let f = FastDiv::of(chunk);
        for (k, &d) in chunk.iter().enumerate() {
            assert_eq!(f.magic[k] == 0, d == 1, "divisor {d}");
            // Edges (0, multiples of d and their neighbours, the top) and random values.
            let mut ns = vec![0u32, 1, (1 << 31) - 1, (1 << 31) - 2];
            for m in [1i64, 2, 3, (((1i64 << 31) - 1) / d).max(1)] {
                for delta in [-1i64, 0, 1] {
                    let v = m * d + delta;
                    if (0..1 << 31).contains(&v) {
                        ns.push(v as u32);
                    }
                }
            }
            for _ in 0..2000 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ns.push((seed >> 33) as u32);
            }
            for n in ns {
                assert_eq!(fast_quotient(&f, k, n) as i64, n as i64 / d, "{n} / {d}");
            }
        }
    }
}

#[test]
fn collapse_merges_contiguous_runs_and_drops_unit_dims() {
    // A contiguous copy of [1, 8, 4, 4] is one run.
    let (d, s) = collapse(&[1, 8, 4, 4], &[&[128, 16, 4, 1]]);
    assert_eq!((d, s), (vec![128], vec![vec![1]]));
    // NCHW -> NHWC of [2, 3, 4, 5]: out dims [2, 4, 5, 3], H and W merge.
    let (d, s) = collapse(&[2, 4, 5, 3], &[&[60, 5, 1, 20]]);
    assert_eq!((d, s), (vec![2, 20, 3], vec![vec![60, 1, 20]]));
    // A [1, C, 1, 1] scale over [1, C, H, W] next to a full operand: C and H*W stay apart.
    let (d, s) = collapse(&[1, 3, 4, 4], &[&[48, 16, 4, 1], &[3, 1, 0, 0]]);
    assert_eq!(d, vec![3, 16]);
    assert_eq!(s, vec![vec![16, 1], vec![1, 0]]);
    // Rank 0.
    assert_eq!(collapse(&[], &[&[]]), (vec![], vec![vec![]]));
}

#[test]
fn steps_with_bad_sizes_are_errors_before_any_launch() {
    let plan = plan_of(vec![
        tensor("x", &[2, 3, 4], Layout::Plain),
        tensor("y", &[2, 4, 3], Layout::Plain),
        tensor("s", &[3], Layout::Plain),
    ]);
    let view = |strides: Vec<i64>, offset| Step::View {
        name: "t".into(),
        input: 0,
        out: 1,
        dims: vec![2, 4, 3],
        strides,
        offset,
    };
    assert_eq!(steps::check(&plan, &view(vec![12, 1, 4], 0)), Ok(()));
    let e = steps::check(&plan, &view(vec![12, 1, 4], 1))
        .expect_err("past the end")
        .to_string();
    assert!(e.contains("0..=24 of 24") || e.contains("of 24"), "{e}");
    assert!(steps::check(&plan, &view(vec![12, 1], 0)).is_err());
    // A broadcast row over [2, 4, 3] and a constant of the wrong size.
    let nary = |b: Operand| Step::Nary {
        name: "add".into(),
        op: EwOp::Add,
        inputs: vec![Operand::Tensor(1), b],
        strides: vec![vec![12, 3, 1], vec![0, 0, 1]],
        dims: vec![2, 4, 3],
        out: 1,
        act: Act::None,
    };
    assert_eq!(steps::check(&plan, &nary(Operand::Tensor(2))), Ok(()));
    assert!(steps::check(&plan, &nary(Operand::Const(vec![1.0; 3], vec![3]))).is_ok());
    let e = steps::check(&plan, &nary(Operand::Const(vec![1.0; 2], vec![2])))
        .expect_err("short")
        .to_string();
    assert!(e.contains("input 1"), "{e}");
    let reduce = Step::Reduce {
        name: "r".into(),
        input: 0,
        out: 2,
        outer: 1,
        len: 8,
        inner: 3,
        op: ReduceOp::Mean,
    };
    assert_eq!(steps::check(&plan, &reduce), Ok(()));
    let gather = |idx: Vec<f32>| Step::Gather {
        name: "g".into(),
        input: 0,
        indices: Operand::Const(idx, vec![1]),
        out: 2,
        outer: 1,
        axis_len: 2,
        count: 1,
        inner: 12,
    };
    assert!(
        steps::check(&plan, &gather(vec![-2.0])).is_err(),
        "3 of 12 outputs"
    );
    let missing = Step::Unary {
        name: "u".into(),
        input: 7,
        out: 1,
        act: Act::Relu,
    };
    assert!(
        steps::check(&plan, &missing)
            .unwrap_err()
            .to_string()
            .contains("tensor 7")
    );
}

#[test]
fn pad_args_follow_stored_dims() {
    // NHWC tensors pad in stored order: [N, H, W, C].
    let plan = plan_of(vec![
        tensor("x", &[1, 3, 4, 4], Layout::Nhwc),
        tensor("y", &[1, 3, 6, 5], Layout::Nhwc),
    ]);
    let a =
        pad_args(&plan, 0, 1, &[1, 4, 4, 3], &[0, 1, 0, 0], PadMode::Reflect).expect("pad args");
    assert_eq!(&a.out_dims[..4], &[1, 6, 5, 3]);
    assert_eq!(&a.begin[..4], &[0, 1, 0, 0]);
    assert_eq!((a.rank, a.mode), (4, 1));
    assert!(pad_args(&plan, 0, 1, &[1, 3, 4, 4], &[0, 1, 0, 0], PadMode::Edge).is_ok());
    assert!(pad_args(&plan, 0, 1, &[1, 4, 4], &[0, 1, 0], PadMode::Edge).is_err());
}

/// The near ties the run settles: the fastest alone always, then every candidate within the
/// margin of it, in the order timed; nothing at a margin of 0 beside the fastest.
#[test]
fn near_ties_keep_the_fastest_and_those_within_the_margin() {
    use super::choose::near_ties;
    let timed = || vec![(10.0, "a"), (10.5, "b"), (11.0, "c"), (11.2, "d")];
    assert_eq!(near_ties(timed(), 0.10), vec!["a", "b", "c"]);
    assert_eq!(near_ties(timed(), 0.0), vec!["a"]);
    assert_eq!(near_ties(timed(), 1.0), vec!["a", "b", "c", "d"]);
    assert_eq!(
        near_ties(Vec::<(f64, &str)>::new(), 0.1),
        Vec::<&str>::new()
    );
    // A candidate whose timing is not a number is never a contender.
    assert_eq!(near_ties(vec![(1.0, "a"), (f64::NAN, "b")], 0.5), vec!["a"]);
}
