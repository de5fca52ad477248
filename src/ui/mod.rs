//! The desktop workbench (eframe/egui). Placeholder until the app lands.

use std::path::PathBuf;

pub fn run(_path: Option<PathBuf>) -> anyhow::Result<()> {
    anyhow::bail!(
        "the desktop workbench is not part of this build yet; use the CLI (`quantscope --help`)"
    )
}
