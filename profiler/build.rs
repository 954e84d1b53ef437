use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

/// Builds the kernel programs with the nightly toolchain and bpf-linker (`cargo xtask setup`
/// installs both) so that `profiler` can embed the object.
fn main() -> anyhow::Result<()> {
    // The fuzz targets (`cargo xtask fuzz`, `--cfg fuzzing`) parse bytes and load nothing: an
    // empty object spares them the BPF build.
    if std::env::var_os("CARGO_CFG_FUZZING").is_some() {
        let object = std::path::Path::new(&std::env::var("OUT_DIR")?).join("profiler");
        std::fs::write(&object, b"")?;
        return Ok(());
    }
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "profiler-ebpf")
        .ok_or_else(|| anyhow!("profiler-ebpf package not found"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    aya_build::build_ebpf(
        [Package {
            name: ebpf.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        Toolchain::default(),
    )?;
    let object = std::path::Path::new(&std::env::var("OUT_DIR")?).join("profiler");
    strip_dwarf(&object).with_context(|| format!("stripping the DWARF of {}", object.display()))
}

/// Remove the DWARF sections (and their relocations) of the BPF object, as `llvm-strip -g` does:
/// bpf-linker derives the BTF the kernel needs from them and writes it to `.BTF` and `.BTF.ext`,
/// and the loader reads nothing else of them. Over half the object (and 1.9 MB of the binary it
/// is embedded in) is DWARF.
fn strip_dwarf(path: &std::path::Path) -> anyhow::Result<()> {
    let data = std::fs::read(path)?;
    let mut builder = object::build::elf::Builder::read(&*data)?;
    for section in builder.sections.iter_mut() {
        let name = section.name.as_slice();
        let dwarf = |prefix: &[u8]| name.starts_with(prefix);
        if dwarf(b".debug_") || dwarf(b".rel.debug_") || dwarf(b".rela.debug_") {
            section.delete = true;
        }
    }
    builder.delete_orphans();
    // LLVM names sections from the symbols' string table; the writer wants a table of its own.
    let section_names = object::build::elf::SectionData::SectionString;
    if !builder
        .sections
        .iter()
        .any(|s| matches!(s.data, object::build::elf::SectionData::SectionString))
    {
        let section = builder.sections.add();
        section.name = b".shstrtab"[..].into();
        section.sh_type = object::elf::SHT_STRTAB;
        section.data = section_names;
    }
    let mut stripped = Vec::new();
    builder.write(&mut stripped)?;
    std::fs::write(path, stripped)?;
    Ok(())
}
