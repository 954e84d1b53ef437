//! An ELF section's bytes as the file means them: decompressed where the file compressed them
//! (`SHF_COMPRESSED`: Go's linker compresses its DWARF, `.debug_frame` included, with zlib;
//! `ld --compress-debug-sections` and `objcopy` with zlib or zstd). Bounded: a crafted header
//! claiming a huge size is refused, never allocated.
use std::{borrow::Cow, io::Read as _};

use object::{CompressionFormat, ObjectSection as _};

/// No section bpfprof reads decompresses to more than this (rustc's driver library, the largest
/// seen here, has a 31 MB `.eh_frame`).
const MAX_SECTION_BYTES: u64 = 1 << 30;
/// What is set aside before the first byte is decompressed.
const INITIAL_CAPACITY: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SectionError {
    #[error("cannot be read: {0}")]
    Elf(#[from] object::Error),
    #[error("is compressed in a format bpfprof does not read")]
    UnknownCompression,
    #[error("claims {0} bytes uncompressed, more than bpfprof reads")]
    TooLarge(u64),
    #[error("has corrupt compressed data: {0}")]
    Corrupt(String),
}

/// The section's bytes, decompressed if need be.
pub fn section_data<'data>(section: &object::Section<'data, '_>) -> Result<Cow<'data, [u8]>, SectionError> {
    let compressed = section.compressed_data()?;
    if compressed.format == CompressionFormat::None {
        return Ok(Cow::Borrowed(compressed.data));
    }
    let size = compressed.uncompressed_size;
    if size > MAX_SECTION_BYTES {
        return Err(SectionError::TooLarge(size));
    }
    // Grown as the data comes: the size is the file's claim, not yet a fact.
    let mut out = Vec::with_capacity(size.min(INITIAL_CAPACITY) as usize);
    let read = match compressed.format {
        CompressionFormat::Zlib => flate2::read::ZlibDecoder::new(compressed.data)
            .take(size)
            .read_to_end(&mut out),
        CompressionFormat::Zstandard => ruzstd::decoding::StreamingDecoder::new(compressed.data)
            .map_err(|e| SectionError::Corrupt(e.to_string()))?
            .take(size)
            .read_to_end(&mut out),
        _ => return Err(SectionError::UnknownCompression),
    };
    read.map_err(|e| SectionError::Corrupt(e.to_string()))?;
    if out.len() as u64 != size {
        return Err(SectionError::Corrupt(format!(
            "{} bytes where its header says {size}",
            out.len()
        )));
    }
    Ok(Cow::Owned(out))
}
