//! Walking folders the user did not curate: symlink loops, FIFOs, devices and huge files
//! must neither hang nor explode the walk, and files that are not plain images are never opened.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::{DataError, is_image};

/// Largest file the tool will open as one image or mask. Real photos and masks are far
/// smaller; anything above is a disk image or video misnamed, and reading it would stall.
pub const MAX_IMAGE_FILE_BYTES: u64 = 256 * 1024 * 1024;

/// Checks, without opening it, that `path` (after following links) is a regular file of at
/// most `max_bytes`. Opening a FIFO blocks until a writer appears and reading a device can
/// stall or never end, so this must run before any `File::open` on user-chosen paths.
/// Returns the file size, or a reason that says what is wrong and what to do.
pub(crate) fn check_regular_file(path: &Path, max_bytes: u64) -> Result<u64, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read the file: {e}"))?;
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a folder"
        } else {
            "not a regular file (a FIFO, socket or device)"
        };
        return Err(format!(
            "is {kind}, so it is not opened; point at a regular file or remove it from the folder"
        ));
    }
    if meta.len() > max_bytes {
        return Err(format!(
            "is {} MiB, over the {} MiB limit for one file; shrink it or remove it from the folder",
            meta.len() / (1024 * 1024),
            max_bytes / (1024 * 1024)
        ));
    }
    Ok(meta.len())
}

/// Every image below `dir`, recursively, sorted by path; and how many other entries were
/// skipped (non-images, non-regular files, files over [`MAX_IMAGE_FILE_BYTES`], entries that
/// cannot be read).
///
/// Each directory is entered at most once, keyed by its canonical path, so a symlink back to
/// an ancestor (or two links to the same place) ends the walk instead of recursing forever.
/// The first path reached in sorted depth-first order is the one reported, so results are
/// the same from run to run.
pub fn list_images(dir: &Path) -> Result<(Vec<PathBuf>, usize), DataError> {
    let folder_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DataError::Folder { path, source }
    };
    let root_canonical = std::fs::canonicalize(dir).map_err(folder_err(dir))?;
    let mut visited = HashSet::from([root_canonical]);
    let mut images = vec![];
    let mut skipped = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut entries = vec![];
        for e in std::fs::read_dir(&d).map_err(folder_err(&d))? {
            match e {
                Ok(e) => entries.push(e.path()),
                // An entry that vanished or cannot be stat'ed while listing is not an image we
                // could use; count it so the user sees that something was left out.
                Err(_) => skipped += 1,
            }
        }
        // read_dir order is file-system dependent; sorting makes "which link to a directory
        // wins" deterministic.
        entries.sort();
        let mut subdirs = vec![];
        for p in entries {
            // `metadata` follows links, so a link is judged by what it points at; a dangling
            // link fails here and is counted as skipped.
            let Ok(meta) = std::fs::metadata(&p) else {
                skipped += 1;
                continue;
            };
            if meta.is_dir() {
                match std::fs::canonicalize(&p) {
                    // Already entered (a loop, or a second link to the same folder) when the
                    // insert finds it: its images are listed under the first path.
                    Ok(c) => {
                        if visited.insert(c) {
                            subdirs.push(p);
                        }
                    }
                    Err(_) => skipped += 1,
                }
            } else if !meta.is_file() || !is_image(&p) || meta.len() > MAX_IMAGE_FILE_BYTES {
                skipped += 1;
            } else {
                images.push(p);
            }
        }
        // Reversed so that the stack pops subfolders in sorted order.
        stack.extend(subdirs.into_iter().rev());
    }
    images.sort();
    Ok((images, skipped))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::time::Duration;

    /// Runs `f` on its own thread and panics if it has not finished in `secs`: a regression
    /// to a hang should fail the test, not stall the suite. A blocked thread is left behind;
    /// the test process exits anyway.
    pub(crate) fn within<T: Send + 'static>(
        secs: u64,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("data-test-timeout".into())
            .spawn(move || {
                let _ = tx.send(f());
            })
            .expect("spawn");
        rx.recv_timeout(Duration::from_secs(secs))
            .expect("did not finish in time (hang?)")
    }

    fn png(path: &Path) {
        image::RgbImage::from_pixel(2, 2, image::Rgb([1, 2, 3]))
            .save(path)
            .expect("write png");
    }

    /// Makes a FIFO at `path`; false (with the reason printed) where `mkfifo` is unavailable.
    pub(crate) fn mkfifo(path: &Path) -> bool {
        match std::process::Command::new("mkfifo").arg(path).status() {
            Ok(s) if s.success() => true,
            other => {
                println!("skipped: mkfifo unavailable ({other:?})");
                false
            }
        }
    }

    #[cfg(unix)]
    #[test]
    fn symlink_loops_terminate_and_list_each_image_once() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("sub")).expect("mkdir");
        png(&root.join("a.png"));
        png(&root.join("sub/b.png"));
        // Two links to `.` used to make the walk branch forever.
        std::os::unix::fs::symlink(".", root.join("l1")).expect("symlink");
        std::os::unix::fs::symlink(".", root.join("l2")).expect("symlink");
        // A folder outside the root reached through two links is listed once.
        let other = tmp.path().join("other");
        std::fs::create_dir(&other).expect("mkdir");
        png(&other.join("c.png"));
        std::os::unix::fs::symlink(&other, root.join("x")).expect("symlink");
        std::os::unix::fs::symlink(&other, root.join("y")).expect("symlink");

        let r = root.clone();
        let (imgs, _) = within(20, move || list_images(&r)).expect("walk");
        assert_eq!(
            imgs,
            vec![
                root.join("a.png"),
                root.join("sub/b.png"),
                root.join("x/c.png")
            ]
        );
    }

    #[test]
    fn fifo_and_huge_files_are_skipped_and_counted() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        png(&root.join("a.png"));
        // Sparse, so it costs no disk space.
        let big = std::fs::File::create(root.join("big.png")).expect("create");
        big.set_len(MAX_IMAGE_FILE_BYTES + 1).expect("set_len");
        let has_fifo = mkfifo(&root.join("x.png"));

        let r = root.clone();
        let (imgs, skipped) = within(20, move || list_images(&r)).expect("walk");
        assert_eq!(imgs, vec![root.join("a.png")]);
        assert_eq!(skipped, 1 + usize::from(has_fifo));
    }
}
