//! Writing outputs without destroying anything: every file is written to a temporary file in
//! the same folder and renamed into place (an interrupted write leaves the old file whole), and
//! an output path that names one of the run's inputs is refused before the run starts. Outputs
//! that are not files (`-` for stdout, a FIFO, `/dev/null`) are written through as streams,
//! never replaced.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Why an output could not be written; names the file.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{}: this output is also an input ({what}); writing it would destroy the input. Choose another output path",
        path.display()
    )]
    IsInput { path: PathBuf, what: String },
    #[error("{}: {why}", path.display())]
    Refused { path: PathBuf, why: String },
}

/// Where an output's bytes go.
#[derive(Debug, PartialEq)]
enum Target {
    /// `-`: standard output.
    Stdout,
    /// A FIFO, a character device or a socket (`/dev/null`, `/dev/stdout`): opened and written
    /// in place; renaming a file over it would replace the device node.
    Stream(PathBuf),
    /// A regular file (or one to create), replaced atomically. For a symlink inside the output's
    /// folder this is the link's target, so the link stays.
    File(PathBuf),
}

/// The name that means standard output for `--report`, `--md` and `--csv`.
pub const STDOUT: &str = "-";

/// True for the `-` that means standard output.
pub fn is_stdout(path: &Path) -> bool {
    path.as_os_str() == STDOUT
}

/// Decides how `path` is written, refusing what must not be: a folder, a block device, a link
/// that dangles, and a link to a regular file outside the output's folder (replacing it would
/// change a file the user never named).
fn target(path: &Path) -> Result<Target, OutputError> {
    if is_stdout(path) {
        return Ok(Target::Stdout);
    }
    let refuse = |why: String| OutputError::Refused {
        path: path.to_path_buf(),
        why,
    };
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(Target::File(path.to_path_buf()));
    };
    let (resolved, meta) = if meta.file_type().is_symlink() {
        let t = path.canonicalize().map_err(|e| {
            refuse(format!(
                "is a symbolic link whose target cannot be reached ({e}); remove the link or give another path"
            ))
        })?;
        let m = std::fs::metadata(&t).map_err(|e| refuse(e.to_string()))?;
        if m.is_file() {
            let dir = parent_dir(path)
                .canonicalize()
                .map_err(|e| refuse(e.to_string()))?;
            if !t.starts_with(&dir) {
                return Err(refuse(format!(
                    "is a symbolic link to {}, outside the output's folder; writing would replace that file. Give its real path if that is what you mean",
                    t.display()
                )));
            }
        }
        (t, m)
    } else {
        (path.to_path_buf(), meta)
    };
    let ft = meta.file_type();
    if ft.is_dir() {
        return Err(refuse("is a folder; give a file name inside it".into()));
    }
    if ft.is_file() {
        return Ok(Target::File(resolved));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_block_device() {
            return Err(refuse(
                "is a block device; quantscope writes reports to files, not disks".into(),
            ));
        }
    }
    Ok(Target::Stream(path.to_path_buf()))
}

/// Opens a FIFO or device for writing. A FIFO is opened without blocking, so one nobody reads
/// is an error rather than a hang; writes then block as usual.
fn open_stream(path: &Path) -> std::io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        let f = o.custom_flags(libc::O_NONBLOCK).open(path).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENXIO) {
                std::io::Error::other("a FIFO that nobody is reading; start the reader first")
            } else {
                e
            }
        })?;
        // SAFETY: fcntl on a descriptor this function owns, with flags it just read.
        unsafe {
            let fd = f.as_raw_fd();
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
            }
        }
        Ok(f)
    }
    #[cfg(not(unix))]
    o.open(path)
}

/// Checks, before a run, that each output can be written the way [`write_with`] will: refuses
/// folders, block devices and links out of the output's folder, and more than one `-`.
pub fn check_outputs<'a>(outputs: impl IntoIterator<Item = &'a Path>) -> Result<(), OutputError> {
    let mut stdout = 0;
    for p in outputs {
        if target(p)? == Target::Stdout {
            stdout += 1;
            if stdout > 1 {
                return Err(OutputError::Refused {
                    path: p.to_path_buf(),
                    why: "only one output can go to standard output".into(),
                });
            }
        }
    }
    Ok(())
}

/// The folder a file lives in, `.` for a bare file name.
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Writes `path` through `fill`. A file is written atomically: the bytes go to a temporary file
/// in the same folder (created if missing), which is flushed and renamed over `path` only when
/// `fill` succeeded; temporary files an earlier killed run left there are removed first. `-`,
/// FIFOs and devices are written through as streams (see [`Target`]).
pub fn write_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), OutputError> {
    let err = |source| OutputError::Write {
        path: path.to_path_buf(),
        source,
    };
    let path = match target(path)? {
        Target::Stdout => {
            let mut out = std::io::stdout().lock();
            fill(&mut out).map_err(err)?;
            return out.flush().map_err(err);
        }
        Target::Stream(p) => {
            let mut f = std::io::BufWriter::new(open_stream(&p).map_err(err)?);
            fill(&mut f).map_err(err)?;
            return f.flush().map_err(err);
        }
        Target::File(p) => p,
    };
    let path = path.as_path();
    let dir = parent_dir(path);
    remove_stale_parts(dir);
    std::fs::create_dir_all(dir).map_err(err)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".quantscope-")
        .suffix(".part")
        .tempfile_in(dir)
        .map_err(err)?;
    // Held until the rename: another run's clean-up leaves a file being written alone.
    tmp.as_file().lock().map_err(err)?;
    {
        let mut w = std::io::BufWriter::new(tmp.as_file_mut());
        fill(&mut w).map_err(err)?;
        w.flush().map_err(err)?;
    }
    // The temporary file is private (0600); the output gets the old file's permissions, or
    // the usual 0644 for a new one.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let perms = std::fs::metadata(path)
            .map(|m| m.permissions())
            .unwrap_or_else(|_| std::fs::Permissions::from_mode(0o644));
        tmp.as_file().set_permissions(perms).map_err(err)?;
    }
    tmp.as_file().sync_all().map_err(err)?;
    tmp.persist(path).map_err(|e| err(e.error))?;
    Ok(())
}

/// Removes the temporary files a killed run left in `dir`. A writer holds a lock on its
/// temporary file until it is renamed, so one that can be locked has no writer left (best
/// effort: a failure to list, lock or remove only leaves the file for next time).
fn remove_stale_parts(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with(".quantscope-") && name.ends_with(".part")) {
            continue;
        }
        let path = e.path();
        let Ok(f) = std::fs::OpenOptions::new().read(true).open(&path) else {
            continue;
        };
        if f.try_lock().is_ok() {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Writes `bytes` to `path` atomically (see [`write_with`]).
pub fn write(path: &Path, bytes: impl AsRef<[u8]>) -> Result<(), OutputError> {
    write_with(path, |w| w.write_all(bytes.as_ref()))
}

/// The length of `path` if it is a regular file (links followed). FIFOs, sockets and devices are
/// refused without being opened: opening a FIFO blocks until someone writes to it.
pub fn regular_file_len(path: &Path) -> Result<u64, String> {
    let m = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if m.is_dir() {
        return Err(format!("{} is a folder, not a file", path.display()));
    }
    if !m.is_file() {
        return Err(format!(
            "{} is not a regular file (a FIFO, socket or device); give a file",
            path.display()
        ));
    }
    Ok(m.len())
}

/// Reads an input file (a model, an experiment, a labels file) whole, after checking that it is
/// a regular file of at most `max_bytes`, so that a FIFO or a device never hangs the run.
pub fn read_input(path: &Path, max_bytes: u64) -> std::io::Result<Vec<u8>> {
    let len = regular_file_len(path).map_err(std::io::Error::other)?;
    if len > max_bytes {
        return Err(std::io::Error::other(format!(
            "{} is {len} bytes, more than the {max_bytes} this kind of file may have",
            path.display()
        )));
    }
    std::fs::read(path)
}

/// Writes `img` as a PNG, atomically (see [`write_with`]).
pub fn write_png(path: &Path, img: &image::DynamicImage) -> Result<(), OutputError> {
    let mut png = std::io::Cursor::new(Vec::new());
    img.write_to(&mut png, image::ImageFormat::Png)
        .map_err(|e| OutputError::Write {
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
    write(path, png.into_inner())
}

/// A path made absolute and free of `.`/`..` and links where it exists; for a file that does not
/// exist yet, its folder is resolved and the file name kept, so two spellings of one future
/// output compare equal.
fn resolved(p: &Path) -> PathBuf {
    if let Ok(c) = p.canonicalize() {
        return c;
    }
    let dir = parent_dir(p);
    match (dir.canonicalize(), p.file_name()) {
        (Ok(d), Some(name)) => d.join(name),
        _ => std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()),
    }
}

/// Refuses an output that is one of the inputs, however spelled. `inputs` are (path, what it is)
/// pairs, e.g. (`model.onnx`, "the model").
pub fn refuse_inputs<'a>(
    outputs: impl IntoIterator<Item = &'a Path>,
    inputs: &[(&Path, &str)],
) -> Result<(), OutputError> {
    let ins: Vec<(PathBuf, &str)> = inputs.iter().map(|(p, w)| (resolved(p), *w)).collect();
    for out in outputs {
        let o = resolved(out);
        if let Some((_, what)) = ins.iter().find(|(i, _)| *i == o) {
            return Err(OutputError::IsInput {
                path: out.to_path_buf(),
                what: what.to_string(),
            });
        }
    }
    Ok(())
}

/// Refuses an output inside one of `folders` (or below it), however spelled. `folders` are
/// (path, what it is) pairs, e.g. (`calib/`, "the calibration folder").
pub fn refuse_inside<'a>(
    outputs: impl IntoIterator<Item = &'a Path>,
    folders: &[(&Path, &str)],
) -> Result<(), OutputError> {
    let dirs: Vec<(PathBuf, &str)> = folders
        .iter()
        .filter_map(|(p, w)| p.canonicalize().ok().map(|c| (c, *w)))
        .collect();
    for out in outputs.into_iter().filter(|o| !is_stdout(o)) {
        let o = resolved(out);
        if let Some((d, what)) = dirs.iter().find(|(d, _)| o.starts_with(d) && o != *d) {
            return Err(OutputError::Refused {
                path: out.to_path_buf(),
                why: format!(
                    "is inside {what} ({}); the next run would read it as data. Write it elsewhere",
                    d.display()
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_leaves_the_old_file_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("report.json");
        write(&p, "old").expect("first write");
        let r = write_with(&p, |w| {
            w.write_all(b"half of the new")?;
            Err(std::io::Error::other("disk full"))
        });
        assert!(r.is_err());
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "old");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left.len(), 1, "no temporary file left behind: {left:?}");
    }

    #[test]
    fn special_files_are_refused_without_opening_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = read_input(dir.path(), 10).unwrap_err();
        assert!(e.to_string().contains("is a folder"), "{e}");
        let big = dir.path().join("big.onnx");
        std::fs::write(&big, [0u8; 64]).expect("write");
        let e = read_input(&big, 10).unwrap_err();
        assert!(e.to_string().contains("64 bytes"), "{e}");
        let fifo = dir.path().join("x.onnx");
        match std::process::Command::new("mkfifo").arg(&fifo).status() {
            Ok(s) if s.success() => {
                // Opening it would block forever; the check must not open it.
                let e = read_input(&fifo, 1 << 20).unwrap_err();
                assert!(e.to_string().contains("not a regular file"), "{e}");
            }
            _ => eprintln!("skipped the FIFO case: mkfifo is not available"),
        }
    }

    #[test]
    fn writes_into_missing_folders() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("a/b/out.md");
        write(&p, "x").expect("write");
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "x");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).expect("meta").permissions().mode() & 0o777;
            assert_eq!(mode, 0o644, "readable like any other output, not private");
        }
    }

    #[test]
    fn an_output_spelled_differently_from_its_input_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("m.onnx");
        std::fs::write(&model, b"model").expect("write");
        let other = dir.path().join("sub/../m.onnx");
        std::fs::create_dir_all(dir.path().join("sub")).expect("mkdir");
        let e = refuse_inputs([other.as_path()], &[(&model, "the model")]).unwrap_err();
        assert!(e.to_string().contains("the model"), "{e}");
        let fresh = dir.path().join("sub/../new.json");
        refuse_inputs([fresh.as_path()], &[(&model, "the model")]).expect("a new file is fine");
    }
}
