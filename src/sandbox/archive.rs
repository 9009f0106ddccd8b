//! Checks a tar archive a client uploads as its bytes pass, before any of
//! it reaches a sandbox: every entry lands inside the directory it is
//! unpacked into, links stay links, and the whole fits the sandbox's disk.
//!
//! The check reads the headers only and passes the bytes on unchanged, so
//! an archive is read once, in blocks, whatever its size. It refuses:
//! - an absolute path, or one with a `..` component (also in a hard
//!   link's target, which names another entry);
//! - an entry under a symbolic link an earlier entry made (`x -> /etc`,
//!   then `x/passwd`): a link is unpacked as a link, never written through;
//! - a device file, a FIFO, or an entry type it does not know;
//! - an archive past the byte limit (the sandbox's disk), decompressed;
//! - a header whose checksum is wrong (not a tar archive, or a damaged one).
//!
//! Long names (GNU `L`/`K` entries, PAX `path`/`linkpath`) are checked as
//! the names they give. What follows the end-of-archive blocks is not
//! passed on: the unpacking tar never reads a byte that was not checked.

use std::collections::HashSet;

use tar::{EntryType, Header, PaxExtensions};
use tokio::io::{AsyncBufRead, AsyncRead};

const BLOCK: usize = 512;
/// Largest long name or PAX header kept to be read.
const MAX_META: u64 = 1024 * 1024;

/// Why an archive is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// An entry that would land outside its directory, or that is not a
    /// file, a directory or a link.
    #[error("entry '{entry}': {why}")]
    Entry { entry: String, why: String },
    /// The archive, decompressed, is larger than the sandbox's disk.
    #[error("the archive is larger than {limit} bytes ({what})")]
    TooLarge { limit: u64, what: String },
    /// Not a tar archive, or a damaged one.
    #[error("not a valid tar archive: {0}")]
    Malformed(String),
}

/// Meta-data an entry carries for the entry after it.
enum Meta {
    LongName,
    LongLink,
    Pax,
    GlobalPax,
}

enum State {
    /// Between entries: the next block is a header.
    Header,
    /// Inside an entry's data (padding included); meta-data is kept.
    Data {
        left: u64,
        keep: Option<(Meta, Vec<u8>, u64)>,
    },
    /// The end-of-archive block was seen.
    Ended,
}

/// Why [`decoder`] takes no archive.
pub const UNSUPPORTED_COMPRESSION: &str = "the archive is bzip2 or xz; send it plain, gzip or zstd";

/// A reader of the tar in `reader`, plain, gzip or zstd as `head` (its
/// first bytes) tells; `None` for bzip2 and xz.
pub fn decoder<'a, R: AsyncBufRead + Send + Unpin + 'a>(
    head: &[u8],
    reader: R,
) -> Option<Box<dyn AsyncRead + Send + Unpin + 'a>> {
    Some(match head {
        [0x1f, 0x8b, ..] => {
            let mut decoder = async_compression::tokio::bufread::GzipDecoder::new(reader);
            decoder.multiple_members(true);
            Box::new(decoder)
        }
        [0x28, 0xb5, 0x2f, 0xfd, ..] => {
            Box::new(async_compression::tokio::bufread::ZstdDecoder::new(reader))
        }
        [b'B', b'Z', b'h', ..] | [0xfd, b'7', b'z', b'X', ..] => return None,
        _ => Box::new(reader),
    })
}

/// The check of one archive, fed its bytes in order.
pub struct ArchiveCheck {
    limit: u64,
    limit_name: String,
    state: State,
    /// A header block read in part.
    partial: Vec<u8>,
    /// The symbolic links earlier entries made, as normal paths.
    links: HashSet<String>,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    /// Bytes passed on so far.
    pub archive_bytes: u64,
    /// Files and links (directories are not counted).
    pub files: u64,
    /// The size of the regular files' contents.
    pub bytes: u64,
}

impl ArchiveCheck {
    /// A check that refuses an archive of more than `limit` bytes, which
    /// the error names as `limit_name` (the setting it comes from).
    pub fn new(limit: u64, limit_name: impl Into<String>) -> ArchiveCheck {
        ArchiveCheck {
            limit,
            limit_name: limit_name.into(),
            state: State::Header,
            partial: Vec::with_capacity(BLOCK),
            links: HashSet::new(),
            long_name: None,
            long_link: None,
            archive_bytes: 0,
            files: 0,
            bytes: 0,
        }
    }

    /// Checks the next bytes of the archive; returns how many of them to
    /// pass on (fewer than given once the archive has ended).
    pub fn feed(&mut self, mut data: &[u8]) -> Result<usize, Refusal> {
        let given = data.len();
        let mut passed = 0;
        while !data.is_empty() {
            match &mut self.state {
                State::Ended => break,
                State::Data { left, keep } => {
                    let take = (*left).min(data.len() as u64) as usize;
                    if let Some((_, kept, size)) = keep {
                        let room = (*size as usize).saturating_sub(kept.len());
                        kept.extend_from_slice(&data[..take.min(room)]);
                    }
                    *left -= take as u64;
                    data = &data[take..];
                    passed += take;
                    if *left == 0 {
                        let keep = keep.take();
                        self.state = State::Header;
                        if let Some((meta, kept, _)) = keep {
                            self.meta(meta, kept)?;
                        }
                    }
                }
                State::Header => {
                    let take = (BLOCK - self.partial.len()).min(data.len());
                    self.partial.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    passed += take;
                    if self.partial.len() == BLOCK {
                        let block = std::mem::replace(&mut self.partial, Vec::with_capacity(BLOCK));
                        self.header(&block)?;
                    }
                }
            }
        }
        self.archive_bytes += passed as u64;
        if self.archive_bytes > self.limit {
            return Err(Refusal::TooLarge {
                limit: self.limit,
                what: self.limit_name.clone(),
            });
        }
        debug_assert!(passed <= given);
        Ok(passed)
    }

    /// Checks that the archive did not stop inside an entry; returns the
    /// bytes to append so that it ends with the end-of-archive blocks.
    pub fn finish(&self) -> Result<&'static [u8], Refusal> {
        static END: [u8; 2 * BLOCK] = [0; 2 * BLOCK];
        match &self.state {
            State::Ended => Ok(&END[..BLOCK]),
            State::Header if self.partial.is_empty() => {
                if self.archive_bytes == 0 {
                    return Err(Refusal::Malformed("the archive is empty".into()));
                }
                if self.long_name.is_some() || self.long_link.is_some() {
                    return Err(Refusal::Malformed(
                        "the archive ends after a long name, before its entry".into(),
                    ));
                }
                Ok(&END)
            }
            _ => Err(Refusal::Malformed(
                "the archive ends inside an entry (cut short?)".into(),
            )),
        }
    }

    fn header(&mut self, block: &[u8]) -> Result<(), Refusal> {
        if block.iter().all(|b| *b == 0) {
            self.state = State::Ended;
            return Ok(());
        }
        let header = Header::from_byte_slice(block);
        let stored = header
            .cksum()
            .map_err(|_| Refusal::Malformed("a header has no readable checksum".into()))?;
        let computed: u32 = block
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u32::from(*b)
                }
            })
            .sum();
        if stored != computed {
            return Err(Refusal::Malformed(format!(
                "a header's checksum is wrong at byte {}",
                self.archive_bytes
            )));
        }
        let size = header
            .entry_size()
            .map_err(|e| Refusal::Malformed(format!("an entry's size: {e}")))?;
        let padded = size.div_ceil(BLOCK as u64) * BLOCK as u64;
        let kind = header.entry_type();
        let meta = match kind {
            EntryType::GNULongName => Some(Meta::LongName),
            EntryType::GNULongLink => Some(Meta::LongLink),
            EntryType::XHeader => Some(Meta::Pax),
            EntryType::XGlobalHeader => Some(Meta::GlobalPax),
            _ => None,
        };
        if let Some(meta) = meta {
            if size > MAX_META {
                return Err(Refusal::Malformed(format!(
                    "a long name or PAX header of {size} bytes (at most {MAX_META})"
                )));
            }
            self.state = State::Data {
                left: padded,
                keep: Some((meta, Vec::with_capacity(size as usize), size)),
            };
            return Ok(());
        }
        let path = self
            .long_name
            .take()
            .unwrap_or_else(|| header.path_bytes().into_owned());
        let link = self
            .long_link
            .take()
            .or_else(|| header.link_name_bytes().map(|l| l.into_owned()));
        self.entry(kind, &path, link.as_deref(), size)?;
        self.state = if padded == 0 {
            State::Header
        } else {
            State::Data {
                left: padded,
                keep: None,
            }
        };
        Ok(())
    }

    fn meta(&mut self, meta: Meta, data: Vec<u8>) -> Result<(), Refusal> {
        let trimmed = |mut data: Vec<u8>| {
            while data.last() == Some(&0) {
                data.pop();
            }
            data
        };
        match meta {
            Meta::LongName => self.long_name = Some(trimmed(data)),
            Meta::LongLink => self.long_link = Some(trimmed(data)),
            Meta::Pax | Meta::GlobalPax => {
                for extension in PaxExtensions::new(&data) {
                    let extension =
                        extension.map_err(|e| Refusal::Malformed(format!("a PAX header: {e}")))?;
                    let key = extension.key_bytes();
                    if key != b"path" && key != b"linkpath" {
                        continue;
                    }
                    if matches!(meta, Meta::GlobalPax) {
                        return Err(Refusal::Malformed(
                            "a global PAX header that names paths for every entry".into(),
                        ));
                    }
                    let value = extension.value_bytes().to_vec();
                    if key == b"path" {
                        self.long_name = Some(value);
                    } else {
                        self.long_link = Some(value);
                    }
                }
            }
        }
        Ok(())
    }

    fn entry(
        &mut self,
        kind: EntryType,
        path: &[u8],
        link: Option<&[u8]>,
        size: u64,
    ) -> Result<(), Refusal> {
        let name = String::from_utf8_lossy(path).into_owned();
        let refuse = |why: String| Refusal::Entry {
            entry: name.clone(),
            why,
        };
        let normal = self.inside(path).map_err(refuse)?;
        match kind {
            EntryType::Regular | EntryType::Continuous => {
                self.files += 1;
                self.bytes += size;
            }
            EntryType::Directory => {}
            EntryType::Symlink => {
                if link.is_none_or(<[u8]>::is_empty) {
                    return Err(refuse("a symbolic link without a target".into()));
                }
                self.files += 1;
                if let Some(normal) = &normal {
                    self.links.insert(normal.clone());
                }
            }
            EntryType::Link => {
                let target = link.unwrap_or_default();
                let target_normal = self
                    .inside(target)
                    .map_err(|why| refuse(format!("its hard link target: {why}")))?;
                if target_normal.is_none() {
                    return Err(refuse("a hard link to the directory itself".into()));
                }
                self.files += 1;
            }
            EntryType::Char | EntryType::Block => {
                return Err(refuse("a device file (not unpacked)".into()));
            }
            EntryType::Fifo => return Err(refuse("a FIFO (not unpacked)".into())),
            other => {
                return Err(refuse(format!(
                    "entry type {:?} ('{}'), which is not unpacked",
                    other,
                    char::from(other.as_byte())
                )));
            }
        }
        if kind != EntryType::Directory && normal.is_none() {
            return Err(refuse("names the directory itself".into()));
        }
        Ok(())
    }

    /// `path` made relative and normal; `None` for the directory itself.
    /// Refuses an absolute path, a `..`, and a path under a link an
    /// earlier entry made.
    fn inside(&self, path: &[u8]) -> Result<Option<String>, String> {
        if path.is_empty() {
            return Err("an empty name".into());
        }
        if path.starts_with(b"/") {
            return Err("an absolute path".into());
        }
        let text = std::str::from_utf8(path).map_err(|_| "a name that is not UTF-8".to_owned())?;
        let mut normal = String::with_capacity(text.len());
        for part in text.split('/') {
            match part {
                "" | "." => continue,
                ".." => return Err("a '..' component".into()),
                part => {
                    if self.links.contains(&normal) && !normal.is_empty() {
                        return Err(format!(
                            "it is under the symbolic link '{normal}' of an earlier entry"
                        ));
                    }
                    if !normal.is_empty() {
                        normal.push('/');
                    }
                    normal.push_str(part);
                }
            }
        }
        Ok((!normal.is_empty()).then_some(normal))
    }
}

#[cfg(test)]
#[path = "archive_tests.rs"]
mod tests;
