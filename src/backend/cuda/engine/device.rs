//! The device plumbing every step and conv implementation launches through: the device
//! (context, main stream, kernels, cuDNN and cuBLASLt handles), device buffers, the engine's
//! memory (the plan's tensors and one scratch), the auxiliary streams, and `Launch`, the
//! narrow context a launch gets instead of the whole engine.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::cublaslt::sys as lt;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, result, sys};

use super::kernels::{Kernels, mma_residual_fits, ptx, ptx_arch};
use super::{LIB_WORKSPACE_BYTES, log_msg};
use crate::backend::cuda::dnn_graph::{ConvGraph, PlanPick};
use crate::backend::cuda::error::{CudaError, CudaResult, dnn_ok, drv, lt_err};
use crate::backend::cuda::plan::{Operand, Plan, TensorDesc};
use crate::backend::cuda::streams::{Schedule, schedule};

/// Shared handles: context, stream, kernels, cuDNN and cuBLASLt.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub(super) k: Kernels,
    pub(super) cudnn: dnn::cudnnHandle_t,
    pub(super) lt: lt::cublasLtHandle_t,
    pub name: String,
    /// Compute capability (major, minor).
    pub compute: (i32, i32),
    /// Whether the tensor-core kernels get room for their residual tile (`mma_residual_fits`).
    pub(super) mma_residual: bool,
    /// Multiprocessors, and bytes of shared memory each (the grids of the kernels whose
    /// blocks step over their work; the streaming wgmma kernel's stages).
    pub(super) sms: usize,
    pub(super) smem_per_sm: usize,
    /// cuDNN graph convs finalized so far, shared by the convs of one geometry and epilogue
    /// (`conv::graph`); the device owns them so they go before its cuDNN handle.
    pub(super) conv_graphs: RefCell<Vec<SharedGraph>>,
}

/// A finalized cuDNN graph conv the engine's convs share: what it computes (geometry and
/// spec), the plans it was asked for, and the graph.
pub(super) struct SharedGraph {
    pub key: String,
    pub pick: PlanPick,
    pub graph: Rc<ConvGraph>,
}

impl Device {
    /// Forgets the shared graphs no conv kept (those of candidates that lost).
    pub(super) fn drop_unused_graphs(&self) {
        self.conv_graphs
            .borrow_mut()
            .retain(|s| Rc::strong_count(&s.graph) > 1);
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        unsafe {
            let _ = self.stream.synchronize();
            // Graph descriptors before the handle they were made with.
            self.conv_graphs.borrow_mut().clear();
            dnn::cudnnDestroy(self.cudnn);
            lt::cublasLtDestroy(self.lt);
        }
    }
}

/// Held while a device is set up and while an engine is built, in any thread: one at a time in
/// a process. The CUDA context is shared by every engine of the process; while a build captures
/// a CUDA graph, cudarc's context-wide synchronize (run when the context's first stream is
/// made) fails in every other thread with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and builds
/// running side by side crashed the parallel tests (H200, 2026-11-28). The app and the CLI build
/// on one thread, so they never wait on it; runs of built engines are not serialised.
static BUILDING: Mutex<()> = Mutex::new(());

thread_local! {
    /// This thread holds [`BUILDING`]: a build that sets up its own device takes it once.
    static HOLDS_BUILDING: Cell<bool> = const { Cell::new(false) };
}

/// [`BUILDING`] while it is held, re-entrant within a thread (the backend's build holds it
/// around `Device::new` and `CudaEngine::build`, which also take it for direct callers).
pub struct BuildGuard(Option<MutexGuard<'static, ()>>);

impl Drop for BuildGuard {
    fn drop(&mut self) {
        if self.0.is_some() {
            HOLDS_BUILDING.with(|h| h.set(false));
        }
    }
}

/// Takes [`BUILDING`] unless this thread holds it already; taken even after a panic elsewhere
/// (it guards no data).
pub fn build_lock() -> BuildGuard {
    if HOLDS_BUILDING.with(|h| h.get()) {
        return BuildGuard(None);
    }
    let g = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    HOLDS_BUILDING.with(|h| h.set(true));
    BuildGuard(Some(g))
}

impl Device {
    pub fn new() -> CudaResult<Device> {
        let _one_at_a_time = build_lock();
        let ctx = drv(CudaContext::new(0), "creating the CUDA context")?;
        let (maj, min) = drv(ctx.compute_capability(), "compute capability")?;
        let name = drv(ctx.name(), "device name")?;
        let stream = drv(ctx.new_stream(), "creating a stream")?;
        let ptx_src = ptx(&ptx_arch((maj, min)))?;
        let module = drv(
            ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx_src)),
            "loading the kernels",
        )?;
        let smem_per_sm = drv(
            ctx.attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            ),
            "shared memory per multiprocessor",
        )?
        .max(0) as usize;
        let pdl = (maj, min) >= (9, 0) && pdl_enabled();
        let k = Kernels::load(&module, pdl, (maj, min), smem_per_sm)?;
        let sms = drv(
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            "multiprocessor count",
        )?
        .max(1) as usize;
        let mut cudnn = std::ptr::null_mut();
        dnn_ok(unsafe { dnn::cudnnCreate(&mut cudnn) }, "cudnnCreate")?;
        dnn_ok(
            unsafe { dnn::cudnnSetStream(cudnn, stream.cu_stream() as _) },
            "cudnnSetStream",
        )?;
        let lt = cudarc::cublaslt::result::create_handle().map_err(lt_err("cublasLtCreate"))?;
        Ok(Device {
            ctx,
            stream,
            k,
            cudnn,
            lt,
            name,
            compute: (maj, min),
            mma_residual: mma_residual_fits(smem_per_sm),
            sms,
            smem_per_sm,
            conv_graphs: RefCell::new(vec![]),
        })
    }

    /// Blocks of `smem` bytes of dynamic shared memory an SM holds at once (the driver keeps
    /// 1 KiB a block), at least one: the grid of the kernels whose blocks step over their
    /// work, as many as run at once. Registers and launch bounds may allow fewer: callers cap
    /// it at those.
    pub(super) fn resident_blocks(&self, smem: usize) -> usize {
        (self.smem_per_sm / (smem + 1024)).max(1)
    }
}

/// Whether kernels launch as programmatic dependent launches where the GPU has them
/// (`kernels::Kernel`): `QUANTSCOPE_CUDA_PDL=off` (or 0) launches them plainly, to compare.
fn pdl_enabled() -> bool {
    !matches!(
        std::env::var("QUANTSCOPE_CUDA_PDL").as_deref(),
        Ok("off" | "0")
    )
}

/// A device allocation freed on drop.
pub struct DevBuf {
    pub ptr: u64,
    pub bytes: usize,
}

impl DevBuf {
    pub(super) fn new(bytes: usize) -> CudaResult<DevBuf> {
        let b = bytes.max(256);
        let ptr = drv(unsafe { result::malloc_sync(b) }, "cuMemAlloc")?;
        drv(unsafe { result::memset_d8_sync(ptr, 0, b) }, "cuMemset")?;
        Ok(DevBuf { ptr, bytes: b })
    }
    pub(super) fn from_slice<T: Copy>(v: &[T]) -> CudaResult<DevBuf> {
        let b = DevBuf::new(std::mem::size_of_val(v))?;
        if !v.is_empty() {
            drv(
                unsafe { result::memcpy_htod_sync(b.ptr, v) },
                "cuMemcpyHtoD",
            )?;
        }
        Ok(b)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        unsafe {
            let _ = result::free_sync(self.ptr);
        }
    }
}

/// Bytes of each part of the engine-wide scratch, which only the main stream uses: a conv's
/// raw output (and a split global average pool's partial sums), im2col columns, an FP16 (or
/// channel-padded) copy of a conv input, and the libraries' workspace.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ScratchSizes {
    pub raw: usize,
    pub col: usize,
    pub f16_in: usize,
}

/// The engine's device memory: a buffer per slot of the plan's tensors, the scratch, and
/// each step's uploaded `Step::constants()`.
pub(super) struct Memory {
    bufs: Vec<DevBuf>,
    slot_of: Vec<usize>,
    scratch: DevBuf,
    col_off: usize,
    f16_in_off: usize,
    ws_off: usize,
    /// Each step's constants, in `Step::constants()` order (`None` for an empty one, which the
    /// kernels take as a null pointer: absent).
    consts: Vec<Vec<Option<DevBuf>>>,
}

impl Memory {
    /// Allocates `sizes[slot]` bytes a slot, the scratch, and uploads the plan's constants.
    pub(super) fn new(
        plan: &Plan,
        slot_of: Vec<usize>,
        sizes: &[usize],
        scratch: ScratchSizes,
    ) -> CudaResult<Memory> {
        let bufs = sizes
            .iter()
            .map(|&s| DevBuf::new(s))
            .collect::<CudaResult<_>>()?;
        let round = |v: usize| v.div_ceil(256) * 256;
        let col_off = round(scratch.raw);
        let f16_in_off = col_off + round(scratch.col);
        let ws_off = f16_in_off + round(scratch.f16_in);
        let mut consts = Vec::with_capacity(plan.steps.len());
        for s in &plan.steps {
            let mut v = vec![];
            for c in s.constants() {
                v.push(if c.is_empty() {
                    None
                } else {
                    Some(DevBuf::from_slice(c)?)
                });
            }
            consts.push(v);
        }
        Ok(Memory {
            bufs,
            slot_of,
            scratch: DevBuf::new(ws_off + LIB_WORKSPACE_BYTES)?,
            col_off,
            f16_in_off,
            ws_off,
            consts,
        })
    }

    /// Device pointer of tensor `t`.
    pub(super) fn ptr(&self, t: usize) -> u64 {
        self.bufs[self.slot_of[t]].ptr
    }

    pub(super) fn slot_of(&self) -> &[usize] {
        &self.slot_of
    }

    /// Bytes of the tensors' buffers.
    pub(super) fn activations_bytes(&self) -> u64 {
        self.bufs.iter().map(|b| b.bytes as u64).sum()
    }

    /// Bytes of the scratch (the main stream's workspace included).
    pub(super) fn scratch_bytes(&self) -> u64 {
        self.scratch.bytes as u64
    }

    /// Bytes of the uploaded constants as the plan holds them.
    pub(super) fn constants_bytes(plan: &Plan) -> u64 {
        plan.steps
            .iter()
            .flat_map(|s| s.constants())
            .map(|c| std::mem::size_of_val(c) as u64)
            .sum()
    }
}

/// An auxiliary stream, with the library workspace of the steps that run on it (the main
/// stream's is in the engine's scratch).
struct AuxStream {
    stream: Arc<CudaStream>,
    ws: Option<DevBuf>,
    /// Recorded on the main stream before a run (this stream waits for it) and on this stream
    /// after its last step (the main stream waits for that).
    fork: CudaEvent,
    join: CudaEvent,
}

/// The streams beside the main one that `streams::schedule` puts steps on, the events that
/// order them, and the stream launches go to now.
#[derive(Default)]
pub(super) struct Lanes {
    aux: Vec<AuxStream>,
    /// Stream of each step and its waits; `None` while every step runs on the main stream.
    schedule: Option<Schedule>,
    /// Per step, the event recorded after it where a step on another stream waits for it.
    events: Vec<Option<CudaEvent>>,
    /// Stream the launches go to: 0 the main one, k the aux stream k - 1.
    lane: Cell<usize>,
}

impl Lanes {
    /// Puts independent branches on auxiliary streams (`streams::schedule`), each with a
    /// workspace of `ws_need(step)` bytes at most for its steps. `movable[s]`: step `s` took
    /// none of the main stream's scratch in the first run. Leaves everything on the main
    /// stream where no step has a branch to run beside.
    pub(super) fn set_up(
        dev: &Device,
        plan: &Plan,
        slot_of: &[usize],
        movable: &[bool],
        ws_need: impl Fn(usize) -> usize,
    ) -> CudaResult<Lanes> {
        let sch = schedule(plan, slot_of, movable, super::aux_streams());
        if sch.streams == 1 {
            return Ok(Lanes::default());
        }
        let mut need = vec![0usize; sch.streams - 1];
        for (si, &k) in sch.stream.iter().enumerate() {
            if k > 0 {
                need[k - 1] = need[k - 1].max(ws_need(si));
            }
        }
        let event = || drv(dev.ctx.new_event(None), "event");
        let mut aux = vec![];
        for bytes in need {
            aux.push(AuxStream {
                stream: drv(dev.ctx.new_stream(), "creating a stream")?,
                ws: (bytes > 0).then(|| DevBuf::new(bytes)).transpose()?,
                fork: event()?,
                join: event()?,
            });
        }
        let events = sch
            .signalled()
            .into_iter()
            .map(|e| e.then(event).transpose())
            .collect::<CudaResult<_>>()?;
        for (si, s) in plan.steps.iter().enumerate() {
            if sch.stream[si] > 0 || !sch.waits[si].is_empty() {
                let waits: Vec<&str> = sch.waits[si]
                    .iter()
                    .map(|&w| plan.steps[w].name())
                    .collect();
                log_msg(&format!(
                    "stream {}: `{}` after {waits:?}",
                    sch.stream[si],
                    s.name()
                ));
            }
        }
        Ok(Lanes {
            aux,
            schedule: Some(sch),
            events,
            lane: Cell::new(0),
        })
    }

    pub(super) fn schedule(&self) -> Option<&Schedule> {
        self.schedule.as_ref()
    }

    /// Stream of step `si`: 0 the main one.
    pub(super) fn stream_of(&self, si: usize) -> usize {
        self.schedule.as_ref().map_or(0, |s| s.stream[si])
    }

    /// Bytes of the auxiliary streams' workspaces.
    pub(super) fn workspace_bytes(&self) -> u64 {
        self.aux
            .iter()
            .filter_map(|a| a.ws.as_ref())
            .map(|b| b.bytes as u64)
            .sum()
    }

    /// The stream launches go to.
    fn stream<'a>(&'a self, dev: &'a Device) -> &'a CudaStream {
        match self.lane.get() {
            0 => &dev.stream,
            k => &self.aux[k - 1].stream,
        }
    }

    /// Makes launches go to stream `lane`, cuDNN's included.
    fn set_lane(&self, dev: &Device, lane: usize) -> CudaResult<()> {
        if self.lane.replace(lane) != lane {
            dnn_ok(
                unsafe { dnn::cudnnSetStream(dev.cudnn, self.stream(dev).cu_stream() as _) },
                "cudnnSetStream",
            )?;
        }
        Ok(())
    }

    /// Runs `step(si)` for every step in plan order, each on its stream: the auxiliary
    /// streams fork from the main one first and join it at the end, so that the run (and a
    /// captured graph) starts and ends on the main stream.
    pub(super) fn run(
        &self,
        dev: &Device,
        steps: usize,
        step: impl Fn(usize) -> CudaResult<()>,
    ) -> CudaResult<()> {
        let Some(sch) = &self.schedule else {
            return (0..steps).try_for_each(step);
        };
        let main = &dev.stream;
        let run = || -> CudaResult<()> {
            for a in &self.aux {
                drv(a.fork.record(main), "event record")?;
                drv(a.stream.wait(&a.fork), "stream wait")?;
            }
            for si in 0..steps {
                self.set_lane(dev, sch.stream[si])?;
                for &w in &sch.waits[si] {
                    let e = self.events[w]
                        .as_ref()
                        .ok_or_else(|| CudaError::Internal("missing event".into()))?;
                    drv(self.stream(dev).wait(e), "stream wait")?;
                }
                step(si)?;
                if let Some(e) = &self.events[si] {
                    drv(e.record(self.stream(dev)), "event record")?;
                }
            }
            for a in &self.aux {
                drv(a.join.record(&a.stream), "event record")?;
                drv(main.wait(&a.join), "stream wait")?;
            }
            Ok(())
        };
        let r = run();
        self.set_lane(dev, 0)?;
        r
    }
}

/// What one step's launch gets: the device (kernels, library handles), the plan's tensors
/// and their buffers, the stream it goes to with that stream's library workspace, and the
/// step's constants. Taking a part of the scratch (raw output, im2col columns, FP16 input
/// copy), which only the main stream owns, marks the step as bound to the main stream.
pub(super) struct Launch<'a> {
    pub dev: &'a Device,
    pub plan: &'a Plan,
    pub stream: &'a CudaStream,
    mem: &'a Memory,
    si: usize,
    ws: (u64, usize),
    scratch_taken: &'a Cell<bool>,
}

impl<'a> Launch<'a> {
    /// The context of step `si` on the stream the lanes point at now.
    pub(super) fn new(
        dev: &'a Device,
        plan: &'a Plan,
        mem: &'a Memory,
        lanes: &'a Lanes,
        si: usize,
        scratch_taken: &'a Cell<bool>,
    ) -> Launch<'a> {
        let ws = match lanes.lane.get() {
            0 => (mem.scratch.ptr + mem.ws_off as u64, LIB_WORKSPACE_BYTES),
            k => lanes.aux[k - 1]
                .ws
                .as_ref()
                .map_or((0, 0), |b| (b.ptr, b.bytes)),
        };
        Launch {
            dev,
            plan,
            stream: lanes.stream(dev),
            mem,
            si,
            ws,
            scratch_taken,
        }
    }

    pub(super) fn td(&self, t: usize) -> &'a TensorDesc {
        &self.plan.tensors[t]
    }
    /// Device pointer of tensor `t`.
    pub(super) fn ptr(&self, t: usize) -> u64 {
        self.mem.ptr(t)
    }
    /// The raw conv output part of the scratch.
    pub(super) fn raw_ptr(&self) -> u64 {
        self.scratch_taken.set(true);
        self.mem.scratch.ptr
    }
    /// The im2col columns part of the scratch.
    pub(super) fn col_ptr(&self) -> u64 {
        self.scratch_taken.set(true);
        self.mem.scratch.ptr + self.mem.col_off as u64
    }
    /// The FP16 (or channel-padded) input copy part of the scratch.
    pub(super) fn f16_in_ptr(&self) -> u64 {
        self.scratch_taken.set(true);
        self.mem.scratch.ptr + self.mem.f16_in_off as u64
    }
    /// The library workspace of this stream, and its bytes.
    pub(super) fn ws(&self) -> (u64, usize) {
        self.ws
    }
    /// Device pointer of constant `idx` of this step (`Step::constants()` order); 0 (null)
    /// for an empty constant.
    pub(super) fn const_ptr(&self, idx: usize) -> CudaResult<u64> {
        let c = self.mem.consts[self.si]
            .get(idx)
            .ok_or_else(|| CudaError::Internal(format!("constant {idx} was not uploaded")))?;
        Ok(c.as_ref().map_or(0, |b| b.ptr))
    }
    /// (pointer, dtype code, scale) of an operand; constant `ci` of this step is an f32
    /// buffer, dtype -1.
    pub(super) fn operand(&self, o: &Operand, ci: usize) -> CudaResult<(u64, i32, f32)> {
        Ok(match o {
            Operand::Tensor(t) => {
                let d = self.td(*t);
                (self.ptr(*t), d.dtype.code(), d.scale)
            }
            Operand::Const(..) => (self.const_ptr(ci)?, -1, 1.0),
        })
    }
    /// (pointer, dtype code, scale) of tensor `t`, the triple most kernels take per tensor.
    pub(super) fn tensor(&self, t: usize) -> (u64, i32, f32) {
        let d = self.td(t);
        (self.ptr(t), d.dtype.code(), d.scale)
    }
}
