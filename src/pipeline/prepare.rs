//! The prepare stage: load and validate the model, list and check the data, check the outputs
//! and the memory a run needs; everything that can be refused before an engine exists.

use super::*;

/// Everything prepared before engines are built.
pub struct Prepared {
    pub model: Model,
    pub hw: [usize; 2],
    pub task: Option<Task>,
    pub eval: Option<EvalSet>,
    pub calib_images: Vec<PathBuf>,
    /// Calibration images left out because they do not decode, with why (the message names
    /// the file).
    pub unreadable_calib: Vec<(PathBuf, String)>,
    /// The model's output channels (its class count), from the file or inferred once here.
    pub output_channels: Option<usize>,
    /// The preprocessing every stage uses: the experiment's, with the normalisation resolved
    /// (the model's metadata, or ImageNet mean/std assumed) where nobody set it.
    pub preprocess: data::Preprocess,
    pub normalize_source: data::NormalizeSource,
}

impl Prepared {
    /// The same preparation around another model (the INT8 engines' equalized or rounded one).
    pub fn with_model(&self, model: Model) -> Prepared {
        Prepared {
            model,
            hw: self.hw,
            task: self.task,
            eval: self.eval.clone(),
            calib_images: self.calib_images.clone(),
            unreadable_calib: self.unreadable_calib.clone(),
            output_channels: self.output_channels,
            preprocess: self.preprocess.clone(),
            normalize_source: self.normalize_source.clone(),
        }
    }

    /// The preprocessed input for `img`.
    pub fn input_of(&self, img: &image::RgbImage) -> Vec<f32> {
        self.source().input_of(img)
    }

    /// The model and calibration images, as the INT8 preparation reads them.
    pub fn source(&self) -> crate::prepare::Source<'_> {
        crate::prepare::Source {
            model: &self.model,
            hw: self.hw,
            images: &self.calib_images,
            preprocess: &self.preprocess,
        }
    }

    /// Where the evaluation's class order and the input normalisation came from: said in the
    /// log and the report, because either, when wrong, gives a plausible wrong score.
    pub fn assumptions(&self) -> Vec<String> {
        let mut v = vec![self.normalize_source.describe(&self.preprocess.normalize)];
        if let Some(e) = self
            .eval
            .as_ref()
            .filter(|e| e.kind == Task::Classification)
        {
            v.push(e.classes_from.describe());
        }
        let info = &self.model.info;
        if info.prequantized {
            v.push(
                "pre-quantized model: its quantized row runs the model's own Q/DQ and scales \
                 (nothing is calibrated); FP32 and FP16 run the float model it carries (weights \
                 dequantized, activation Q/DQ removed)"
                    .into(),
            );
            v.extend(info.qdq_rewrites.iter().map(|r| format!("at load: {r}")));
            v.extend(info.qdq_kept.iter().cloned());
        }
        if !self.unreadable_calib.is_empty() {
            let list: Vec<String> = self
                .unreadable_calib
                .iter()
                .map(|(_, why)| why.clone())
                .collect();
            v.push(format!(
                "warning: left out {} calibration image(s) that cannot be decoded: {}",
                list.len(),
                list.join("; ")
            ));
        }
        v
    }
}

/// Load → validate → list the data: everything that can be refused before an engine exists.
/// The model's own validation runs inside [`Model::load`]; the experiment's settings, the
/// exclusion names, the memory a run needs and the evaluation labels are checked here.
pub fn prepare(exp: &Experiment) -> Result<Prepared, PipelineError> {
    exp.validate().map_err(PipelineError::Config)?;
    let model = Model::load(&exp.model)?;
    model.check_supported()?;
    quant::check_exclusions(&model, &exp.exclude, "--exclude").map_err(PipelineError::Config)?;
    if let Some(mp) = &exp.mixed_precision {
        quant::check_exclusions(&model, &mp.keep_float, "mixed_precision.keep_float")
            .map_err(PipelineError::Config)?;
        let tensors: Vec<String> = mp.per_tensor.keys().cloned().collect();
        quant::check_tensor_names(&model, &tensors, "mixed_precision.per_tensor")
            .map_err(PipelineError::Config)?;
    }
    let hw = model.input_hw(exp.preprocess.size)?;
    let max = data::MAX_IMAGE_SIDE_PX as usize;
    if hw.iter().any(|&v| v > max) {
        return Err(PipelineError::Config(format!(
            "{}: the input is fixed at {}x{} pixels, more than the {max} per side quantscope evaluates (every image would be resized to it); re-export the model at the size you deploy",
            model.path.display(),
            hw[0],
            hw[1]
        )));
    }
    exp.preprocess
        .check_input_hw(hw)
        .map_err(PipelineError::Config)?;
    // Shapes at this input size, inferred once for the memory check and the class count. An
    // op tract lacks fails inference too (ONNX Runtime may still run the model), but two shapes
    // that contradict each other fail every engine: refused here, in words, before any runs.
    let shapes = match crate::guard::catch("inferring shapes", || {
        crate::model::infer_shapes(&model, hw)
    }) {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) if format!("{e:#}").contains("Impossible to unify") => {
            check_shapes_in_ort(&model, hw, exp.cpu_engine, &format!("{e:#}"))?;
            None
        }
        _ => None,
    };
    check_memory(&model, hw, exp.bench.batch, shapes.as_ref())?;
    let channels = output_channels(&model, shapes.as_ref());
    let mut unreadable_calib = vec![];
    let calib_images = match &exp.calibration.dir {
        Some(d) => {
            let (imgs, skipped) = data::list_images(d)?;
            let imgs = exp.calibration.select.pick(imgs);
            if imgs.is_empty() {
                return Err(data::DataError::NoImages {
                    path: d.clone(),
                    skipped,
                }
                .into());
            }
            // One damaged file must not sink the INT8 engines: it is left out and named.
            let (imgs, bad) = readable_images(imgs);
            if imgs.is_empty() {
                return Err(PipelineError::Config(format!(
                    "{}: none of the {} calibration images can be decoded ({})",
                    d.display(),
                    bad.len(),
                    bad[0].1
                )));
            }
            unreadable_calib = bad;
            imgs
        }
        None => vec![],
    };
    let eval = match &exp.evaluation.dir {
        Some(d) => {
            let exclude: HashSet<PathBuf> = if exp.evaluation.skip_calibration_images {
                calib_images.iter().map(|p| data::canonical(p)).collect()
            } else {
                HashSet::new()
            };
            let labels_file = exp.labels_file();
            let labels = labels_file.as_deref().map(|path| data::LabelsFile {
                path,
                explicit: exp.evaluation.labels.is_some(),
            });
            let mut set = EvalSet::open_labelled(d, &exclude, labels)?;
            if let Some(n) = exp.evaluation.count {
                set.items.truncate(n);
            }
            // The layout is checked against the task first: a segmenter given class folders
            // needs masks, not the labels.txt a class-count check would ask for.
            check_layout(exp.evaluation.task.fixed().or(model.info.task), &set)?;
            set.check_labels(channels.unwrap_or(0), IGNORE_LABEL)?;
            // Masks hold output indices, so a segmentation class-name file only names them:
            // it must name each of the model's classes.
            if let (Task::Segmentation, data::ClassSource::File(l), Some(want)) =
                (set.kind, &set.classes_from, channels)
                && set.classes.len() != want
            {
                if exp.evaluation.labels.is_some() {
                    return Err(PipelineError::Config(format!(
                        "{}: lists {} class names but the model has {want} classes; list one name per class, in output order",
                        l.display(),
                        set.classes.len()
                    )));
                }
                set.classes.clear();
                set.classes_from = data::ClassSource::Folders;
            }
            Some(set)
        }
        None => None,
    };
    let task = exp
        .evaluation
        .task
        .fixed()
        .or(model.info.task)
        .or(eval.as_ref().map(|e| e.kind));
    if let Some(e) = &eval {
        check_layout(task, e)?;
    }
    let (preprocess, normalize_source) = exp.preprocess.resolved(model.info.normalization.as_ref());
    Ok(Prepared {
        model,
        hw,
        task,
        eval,
        calib_images,
        unreadable_calib,
        output_channels: channels,
        preprocess,
        normalize_source,
    })
}

/// Tract found two shapes that contradict each other (`tract_says`). tract's inference is not
/// the last word where ONNX Runtime runs the CPU engine: the model is refused only when ORT
/// cannot load it at this size either (or tract is the engine), with ORT's words where it has
/// them, since they name the node in ONNX terms.
pub(super) fn check_shapes_in_ort(
    model: &Model,
    hw: [usize; 2],
    choice: backend::cpu::CpuEngineChoice,
    tract_says: &str,
) -> Result<(), PipelineError> {
    use backend::cpu::onnxruntime::{self as ort_engine, Optimisation, Use};
    let why = match ort_engine::runtime::resolve(choice) {
        Ok((backend::cpu::CpuEngineKind::Ort, _)) => {
            let bytes = prost::Message::encode_to_vec(&model.with_fixed_input(1, hw));
            match ort_engine::session(&bytes, Optimisation::Exact, 1, Use::Statistics, None) {
                Ok(_) => return Ok(()),
                Err(e) => e,
            }
        }
        _ => tract_says.replace("Failed analyse for node", "node"),
    };
    Err(PipelineError::Config(format!(
        "{}: the model's shapes do not fit together at a {}x{} input: {why}. The file is damaged or was edited; re-export it (or give the --size it was exported for)",
        model.path.display(),
        hw[0],
        hw[1],
    )))
}

/// The resize / crop / pad the evaluation images went through, in words: the geometry moves a
/// metric by points (2.7 on one ImageNet model), so the run says what it applied.
pub(super) fn geometry_note(p: &Prepared, samples: &[Sample]) -> Option<String> {
    let first = samples.first()?;
    let same = samples
        .iter()
        .all(|s| s.geometry.orig_hw == first.geometry.orig_hw);
    Some(format!(
        "input geometry ({}): {}, {} interpolation",
        if same {
            "every evaluation image".to_string()
        } else {
            "the first evaluation image; sizes differ".to_string()
        },
        first.geometry.describe(p.preprocess.resize),
        format!("{:?}", p.preprocess.interpolation).to_lowercase()
    ))
}

/// Refuses an evaluation folder laid out for another task than the model's, saying what the
/// folder must hold instead.
pub(super) fn check_layout(task: Option<Task>, set: &EvalSet) -> Result<(), PipelineError> {
    match task {
        Some(t) if t != set.kind => Err(PipelineError::Config(format!(
            "{}: the evaluation folder is laid out for {:?} but the model's task is {:?}; {}",
            set.root.display(),
            set.kind,
            t,
            match t {
                Task::Segmentation =>
                    "a segmentation folder holds images/ and masks/ (one PNG of class ids per image, same file stem)",
                Task::Classification =>
                    "a classification folder holds one sub-folder of images per class (ImageFolder)",
            }
        ))),
        _ => Ok(()),
    }
}

/// Splits `paths` into the images that decode and (file, why) for those that do not, decoding
/// them in parallel.
pub(super) fn readable_images(paths: Vec<PathBuf>) -> (Vec<PathBuf>, Vec<(PathBuf, String)>) {
    use rayon::prelude::*;
    let checked: Vec<(PathBuf, Option<String>)> = paths
        .into_par_iter()
        .map(|p| {
            let why = data::open_rgb(&p).err().map(|e| e.to_string());
            (p, why)
        })
        .collect();
    let mut ok = vec![];
    let mut bad = vec![];
    for (p, why) in checked {
        match why {
            None => ok.push(p),
            Some(w) => bad.push((p, w)),
        }
    }
    (ok, bad)
}

pub fn load_samples(
    p: &Prepared,
    sink: &dyn Sink,
    cancel: &CancelToken,
) -> Result<Vec<Sample>, PipelineError> {
    let Some(set) = &p.eval else {
        return Ok(vec![]);
    };
    let mut out = Vec::with_capacity(set.items.len());
    for (i, it) in set.items.iter().enumerate() {
        if cancel.is_cancelled() {
            return Err(PipelineError::Cancelled);
        }
        sink.progress("loading evaluation images", i, set.items.len());
        let img = data::open_rgb(&it.image)?;
        let gt = match &it.label {
            Label::Mask(m) => Some(data::read_mask(m)?),
            Label::Class(_) => None,
        };
        out.push(Sample {
            input: p.input_of(&img),
            label: it.label.clone(),
            gt,
            geometry: p
                .preprocess
                .geometry([img.height() as usize, img.width() as usize], p.hw),
        });
    }
    Ok(out)
}

/// Refuses, before the run, an output that would destroy an input (the model, the labels, the
/// experiment file, a data folder's masks), an output that is a folder, and two outputs that
/// are one file. `more_inputs` and `more_outputs` are the caller's own (the CLI's experiment
/// file and `--save-experiment`).
pub fn check_outputs(
    exp: &Experiment,
    more_inputs: &[(&Path, &str)],
    more_outputs: &[&Path],
) -> Result<(), PipelineError> {
    let files: Vec<&Path> = exp
        .output
        .report_files()
        .map(PathBuf::as_path)
        .chain(more_outputs.iter().copied())
        .collect();
    let err = |e: crate::files::OutputError| PipelineError::Config(e.to_string());
    crate::files::check_outputs(files.iter().copied()).map_err(err)?;
    let mut inputs: Vec<(&Path, &str)> = vec![(exp.model.as_path(), "the model")];
    inputs.extend(
        exp.evaluation
            .labels
            .as_deref()
            .map(|l| (l, "the labels file")),
    );
    inputs.extend_from_slice(more_inputs);
    crate::files::refuse_inputs(files.iter().copied(), &inputs).map_err(err)?;
    for (i, f) in files.iter().enumerate() {
        crate::files::refuse_inputs(
            files[i + 1..].iter().copied(),
            &[(f, "another output of this run")],
        )
        .map_err(err)?;
    }
    // Overlays are named after the images: written into a data folder they would replace the
    // ground-truth masks.
    let mut data_dirs: Vec<(PathBuf, &str)> = vec![];
    if let Some(d) = &exp.evaluation.dir {
        data_dirs.push((d.clone(), "the evaluation folder"));
        data_dirs.push((d.join("masks"), "the evaluation masks"));
        data_dirs.push((d.join("images"), "the evaluation images"));
    }
    if let Some(d) = &exp.calibration.dir {
        data_dirs.push((d.clone(), "the calibration folder"));
    }
    let data_refs: Vec<(&Path, &str)> = data_dirs.iter().map(|(p, w)| (p.as_path(), *w)).collect();
    let dirs: Vec<&Path> = [&exp.output.masks_dir, &exp.output.qdq_dir]
        .into_iter()
        .flatten()
        .map(PathBuf::as_path)
        .collect();
    crate::files::refuse_inputs(dirs.iter().copied(), &data_refs).map_err(err)?;
    // Nothing goes inside a data folder either: a report or an overlay there would be read as
    // data by the next run (and the folder is the user's, not ours).
    crate::files::refuse_inside(files.iter().chain(&dirs).copied(), &data_refs).map_err(err)
}

/// The model's class count: its output's channel dimension, from the file or from `shapes`
/// (inferred at the experiment's input size).
pub(super) fn output_channels(
    model: &Model,
    shapes: Option<&HashMap<String, Vec<usize>>>,
) -> Option<usize> {
    let s = &model.info.outputs.first()?.shape;
    s.get(1)
        .copied()
        .flatten()
        .map(|v| v as usize)
        .or_else(|| shapes?.get(model.output_name())?.get(1).copied())
}

/// Refuses a run whose tensors cannot fit in memory (`--size 30000,30000`, `--batch 100000`)
/// before anything allocates them: an allocation failure aborts the process, which no error
/// handling can catch. The estimate is every activation at once, times the batch.
pub(super) fn check_memory(
    model: &Model,
    hw: [usize; 2],
    batch: usize,
    shapes: Option<&HashMap<String, Vec<usize>>>,
) -> Result<(), PipelineError> {
    let Some(available) = bench::available_memory_bytes() else {
        return Ok(());
    };
    let input: u64 = model
        .input_shape(1, hw)
        .iter()
        .fold(4u64, |a, &d| a.saturating_mul(d as u64));
    // Without shapes (tract could not infer them), assume activations 16x the input.
    let activations: u64 = match shapes {
        Some(s) => s
            .values()
            .map(|d| d.iter().fold(4u64, |a, &v| a.saturating_mul(v as u64)))
            .fold(0u64, u64::saturating_add),
        None => input.saturating_mul(16),
    };
    let need = input
        .saturating_add(activations)
        .saturating_mul(batch.max(1) as u64);
    if need > available {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        return Err(PipelineError::Config(format!(
            "{}: at {}x{} and batch {batch} the engines need about {:.1} GiB of activations, but {:.1} GiB \
             of memory is available; use a smaller --size or --batch",
            model.path.display(),
            hw[0],
            hw[1],
            gib(need),
            gib(available)
        )));
    }
    Ok(())
}
