//! The query parameters of the monitoring endpoints, parsed from hostile
//! input: bounded, every parameter known, every value checked (an error
//! names the parameter and what it accepts). Fuzzed (`monitor_query`).

/// The longest query string taken.
pub const MAX_QUERY: usize = 1024;
/// The most clients `/connz` returns in one page.
pub const MAX_LIMIT: usize = 1024;
/// Clients per `/connz` page when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 100;

/// What `/connz` sorts clients by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortBy {
    /// Client id, ascending (the default).
    #[default]
    Id,
    /// Bytes pending, most first.
    Pending,
    /// Messages delivered, most first.
    Delivered,
    /// Messages published, most first.
    Published,
    /// Messages dropped (all subscriptions and control), most first.
    Dropped,
    /// Bytes read, most first.
    BytesIn,
    /// Bytes written, most first.
    BytesOut,
    /// Subscriptions, most first.
    Subs,
    /// Connected longest first.
    Since,
}

impl SortBy {
    const NAMES: &'static str =
        "id, pending, delivered, published, dropped, bytes_in, bytes_out, subs, since";

    fn parse(v: &str) -> Option<SortBy> {
        Some(match v {
            "id" => SortBy::Id,
            "pending" => SortBy::Pending,
            "delivered" => SortBy::Delivered,
            "published" => SortBy::Published,
            "dropped" => SortBy::Dropped,
            "bytes_in" => SortBy::BytesIn,
            "bytes_out" => SortBy::BytesOut,
            "subs" => SortBy::Subs,
            "since" => SortBy::Since,
            _ => return None,
        })
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            SortBy::Id => "id",
            SortBy::Pending => "pending",
            SortBy::Delivered => "delivered",
            SortBy::Published => "published",
            SortBy::Dropped => "dropped",
            SortBy::BytesIn => "bytes_in",
            SortBy::BytesOut => "bytes_out",
            SortBy::Subs => "subs",
            SortBy::Since => "since",
        }
    }
}

/// `/connz`'s parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connz {
    /// Sort key (`sort=`).
    pub sort: SortBy,
    /// Clients skipped (`offset=`).
    pub offset: usize,
    /// Clients returned at most (`limit=`, 1 to [`MAX_LIMIT`]).
    pub limit: usize,
    /// Whether each client's subscriptions are listed (`subs=1`).
    pub subs: bool,
}

impl Default for Connz {
    fn default() -> Self {
        Connz {
            sort: SortBy::Id,
            offset: 0,
            limit: DEFAULT_LIMIT,
            subs: false,
        }
    }
}

/// Splits a query string into `name=value` pairs, checking its length
/// and that names and values are plain (letters, digits, `_`, `-`, `.`):
/// nothing in these endpoints needs more, so nothing else is decoded.
fn pairs(query: &str) -> Result<Vec<(&str, &str)>, String> {
    if query.len() > MAX_QUERY {
        return Err(format!("query longer than {MAX_QUERY} bytes"));
    }
    let plain = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    };
    let mut out = Vec::new();
    for part in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        if !plain(k) || !plain(v) {
            return Err(format!(
                "parameter {:?}: names and values are letters, digits, '_', '-' or '.'",
                k.chars().take(32).collect::<String>()
            ));
        }
        if out.iter().any(|(n, _)| *n == k) {
            return Err(format!("parameter {k} given twice"));
        }
        out.push((k, v));
    }
    Ok(out)
}

fn number(name: &str, v: &str, max: usize) -> Result<usize, String> {
    v.parse::<usize>()
        .ok()
        .filter(|n| *n <= max)
        .ok_or_else(|| format!("{name}={v:?}: expected a whole number from 0 to {max}"))
}

fn flag(name: &str, v: &str) -> Result<bool, String> {
    match v {
        "1" | "true" | "" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(format!("{name}={v:?}: expected 1, 0, true or false")),
    }
}

/// Parses `/connz`'s query (`sort`, `offset`, `limit`, `subs`).
pub fn parse_connz(query: &str) -> Result<Connz, String> {
    let mut c = Connz::default();
    for (k, v) in pairs(query)? {
        match k {
            "sort" => {
                c.sort = SortBy::parse(v)
                    .ok_or_else(|| format!("sort={v:?}: expected one of {}", SortBy::NAMES))?
            }
            "offset" => c.offset = number(k, v, u32::MAX as usize)?,
            "limit" => {
                c.limit = number(k, v, MAX_LIMIT)?;
                if c.limit == 0 {
                    return Err(format!("limit=0: expected 1 to {MAX_LIMIT}"));
                }
            }
            "subs" => c.subs = flag(k, v)?,
            _ => {
                return Err(format!(
                    "unknown parameter {k:?}: /connz takes sort, offset, limit, subs"
                ))
            }
        }
    }
    Ok(c)
}

/// `/subsz`'s parameters: one page of the patterns and one of the
/// clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subsz {
    /// Patterns skipped (`offset=`).
    pub offset: usize,
    /// Patterns listed at most (`limit=`, 1 to [`MAX_LIMIT`]).
    pub limit: usize,
    /// Clusters skipped (`cluster_offset=`).
    pub cluster_offset: usize,
    /// Clusters listed at most (`cluster_limit=`, 1 to [`MAX_LIMIT`]).
    pub cluster_limit: usize,
    /// Members listed per cluster at most (`members=`, 0 to
    /// [`MAX_LIMIT`]).
    pub members: usize,
}

impl Default for Subsz {
    fn default() -> Self {
        Subsz {
            offset: 0,
            limit: DEFAULT_LIMIT,
            cluster_offset: 0,
            cluster_limit: DEFAULT_LIMIT,
            members: DEFAULT_LIMIT,
        }
    }
}

/// Parses `/subsz`'s query (`offset`, `limit`, `cluster_offset`,
/// `cluster_limit`, `members`).
pub fn parse_subsz(query: &str) -> Result<Subsz, String> {
    let mut c = Subsz::default();
    let page = |k: &str, v: &str| -> Result<usize, String> {
        let n = number(k, v, MAX_LIMIT)?;
        if n == 0 {
            return Err(format!("{k}=0: expected 1 to {MAX_LIMIT}"));
        }
        Ok(n)
    };
    for (k, v) in pairs(query)? {
        match k {
            "offset" => c.offset = number(k, v, u32::MAX as usize)?,
            "limit" => c.limit = page(k, v)?,
            "cluster_offset" => c.cluster_offset = number(k, v, u32::MAX as usize)?,
            "cluster_limit" => c.cluster_limit = page(k, v)?,
            "members" => c.members = number(k, v, MAX_LIMIT)?,
            _ => {
                return Err(format!(
                    "unknown parameter {k:?}: /subsz takes offset, limit, cluster_offset, cluster_limit, members"
                ))
            }
        }
    }
    Ok(c)
}

/// Checks that an endpoint that takes no parameters got none.
pub fn parse_none(path: &str, query: &str) -> Result<(), String> {
    match pairs(query)?.first() {
        None => Ok(()),
        Some((k, _)) => Err(format!("unknown parameter {k:?}: {path} takes none")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connz_queries() {
        assert_eq!(parse_connz("").unwrap(), Connz::default());
        let c = parse_connz("sort=pending&offset=2&limit=5&subs=1").unwrap();
        assert_eq!(
            c,
            Connz {
                sort: SortBy::Pending,
                offset: 2,
                limit: 5,
                subs: true
            }
        );
        for (q, says) in [
            ("sort=name", "sort="),
            ("limit=0", "limit=0"),
            ("limit=5000", "limit="),
            ("offset=-1", "offset="),
            ("bogus=1", "unknown parameter"),
            ("sort=id&sort=id", "twice"),
            ("sort=%41", "letters"),
            ("subs=maybe", "subs="),
        ] {
            let e = parse_connz(q).unwrap_err();
            assert!(e.contains(says), "{q}: {e}");
        }
        assert!(parse_connz(&"a".repeat(MAX_QUERY + 1)).is_err());
        assert_eq!(parse_subsz("").unwrap(), Subsz::default());
        assert_eq!(
            parse_subsz("offset=1&limit=2&cluster_offset=3&cluster_limit=4&members=0").unwrap(),
            Subsz {
                offset: 1,
                limit: 2,
                cluster_offset: 3,
                cluster_limit: 4,
                members: 0
            }
        );
        for (q, says) in [
            ("limit=0", "limit=0"),
            ("cluster_limit=0", "cluster_limit=0"),
            ("members=5000", "members="),
            ("offset=x", "offset="),
            ("sort=id", "unknown parameter"),
            ("limit=1&limit=2", "twice"),
        ] {
            let e = parse_subsz(q).unwrap_err();
            assert!(e.contains(says), "{q}: {e}");
        }
        assert!(parse_none("/varz", "").is_ok());
        assert!(parse_none("/varz", "x=1").unwrap_err().contains("/varz"));
    }
}
