//! Writing outputs without destroying anything: every file is written to a temporary file in
//! the same folder and renamed into place (an interrupted write leaves the old file whole), and
//! an output path that names one of the run's inputs is refused before the run starts.

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
}

/// The folder a file lives in, `.` for a bare file name.
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Writes `path` through `fill`, atomically: the bytes go to a temporary file in the same folder
/// (created if missing), which is flushed and renamed over `path` only when `fill` succeeded.
pub fn write_with(
    path: &Path,
    fill: impl FnOnce(&mut std::io::BufWriter<&mut std::fs::File>) -> std::io::Result<()>,
) -> Result<(), OutputError> {
    let err = |source| OutputError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = parent_dir(path);
    std::fs::create_dir_all(dir).map_err(err)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".quantscope-")
        .suffix(".part")
        .tempfile_in(dir)
        .map_err(err)?;
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
    write_with(path, |w| {
        img.write_to(w, image::ImageFormat::Png)
            .map_err(std::io::Error::other)
    })
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
