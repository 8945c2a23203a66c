//! `skiff top`: a live view of one node in the terminal (ratatui over
//! crossterm), from the node's stats (the same counters as `skiff stats`)
//! sampled every second: the node's rates, each client's rates, pending
//! bytes and drops, the slow consumers and their subscriptions, and the
//! mesh's peers. Keys sort the clients; `q` quits.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ratatui::backend::{Backend, TestBackend};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};
use ratatui::{Frame, Terminal};
use skiff_proto::stats::{ClientStats, NodeStats};

use crate::node_cmd::NodeLoc;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// `skiff top`
#[derive(clap::Args, Debug)]
pub(crate) struct TopArgs {
    #[command(flatten)]
    loc: NodeLoc,
    /// Seconds between samples.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Print one view (two samples apart) as text and exit, for scripts
    /// and terminals without a screen.
    #[arg(long)]
    once: bool,
}

/// What the clients are sorted by (keys in brackets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sort {
    /// [p] pending bytes.
    Pending,
    /// [o] messages out per second.
    Out,
    /// [i] messages in per second.
    In,
    /// [d] drops per second, then drops.
    Drops,
    /// [c] client id.
    Id,
}

impl Sort {
    fn name(self) -> &'static str {
        match self {
            Sort::Pending => "pending",
            Sort::Out => "msgs out/s",
            Sort::In => "msgs in/s",
            Sort::Drops => "drops",
            Sort::Id => "id",
        }
    }
}

/// Two samples and what follows from them.
struct View {
    now: NodeStats,
    /// Rates per client id: (in/s, out/s, drops/s).
    rates: HashMap<u64, (f64, f64, f64)>,
    /// Node rates: (in/s, out/s, drops/s).
    node: (f64, f64, f64),
    me: u64,
    sort: Sort,
}

fn drops(c: &ClientStats) -> u64 {
    c.subscriptions
        .iter()
        .map(|s| s.counters.dropped)
        .sum::<u64>()
        + c.dropped_control
}

impl View {
    fn new(before: &NodeStats, now: NodeStats, secs: f64, me: u64, sort: Sort) -> View {
        let secs = secs.max(1e-3);
        let prev: HashMap<u64, &ClientStats> = before.clients.iter().map(|c| (c.id, c)).collect();
        let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
        let rates = now
            .clients
            .iter()
            .map(|c| {
                let p = prev.get(&c.id);
                let (pi, po, pd) = p.map_or((0, 0, 0), |p| (p.published, p.delivered, drops(p)));
                (
                    c.id,
                    (
                        rate(c.published, pi),
                        rate(c.delivered, po),
                        rate(drops(c), pd),
                    ),
                )
            })
            .collect();
        let node = (
            rate(now.published, before.published),
            rate(now.delivered, before.delivered),
            rate(
                now.dropped + now.dropped_control + now.remote_drops,
                before.dropped + before.dropped_control + before.remote_drops,
            ),
        );
        View {
            now,
            rates,
            node,
            me,
            sort,
        }
    }

    fn draw(&self, f: &mut Frame) {
        let s = &self.now;
        let mesh_rows = s.mesh.as_ref().map_or(0, |m| m.peers.len() as u16 + 3);
        let [head, clients, slow, mesh, keys] = Layout::vertical([
            Constraint::Length(4),
            Constraint::Min(5),
            Constraint::Length(6),
            Constraint::Length(mesh_rows),
            Constraint::Length(1),
        ])
        .areas(f.area());
        let (i, o, d) = self.node;
        let head_text = vec![
            Line::from(format!(
                "up {:.0}s  clients {} ({} since start)  subscriptions {}  clusters {}  tunnels {}",
                s.uptime_s, s.connections, s.connections_total, s.subscriptions, s.clusters, s.tunnels
            )),
            Line::from(format!(
                "msgs in {i:.0}/s  out {o:.0}/s  dropped {d:.0}/s  |  totals: in {} out {} dropped {} (remote {}, control {})",
                s.published, s.delivered, s.dropped, s.remote_drops, s.dropped_control
            )),
            Line::from(format!(
                "slow consumers closed {}  limit hits {}  protocol errors {}  pending budget used {} B",
                s.slow_consumers, s.limit_hits, s.protocol_errors, s.pending_budget_used
            )),
        ];
        f.render_widget(
            Paragraph::new(head_text).block(Block::bordered().title(" skiff top ")),
            head,
        );
        let mut cs: Vec<&ClientStats> = s.clients.iter().filter(|c| c.id != self.me).collect();
        let r = |c: &ClientStats| self.rates.get(&c.id).copied().unwrap_or_default();
        let by = |x: f64| -(x * 1000.0) as i64;
        match self.sort {
            Sort::Pending => cs.sort_by_key(|c| (std::cmp::Reverse(c.pending_bytes), c.id)),
            Sort::Out => cs.sort_by_key(|c| (by(r(c).1), c.id)),
            Sort::In => cs.sort_by_key(|c| (by(r(c).0), c.id)),
            Sort::Drops => cs.sort_by_key(|c| (by(r(c).2), std::cmp::Reverse(drops(c)), c.id)),
            Sort::Id => cs.sort_by_key(|c| c.id),
        }
        let rows = cs.iter().map(|c| {
            let (ri, ro, rd) = r(c);
            let is_slow = rd > 0.0;
            let row = Row::new(vec![
                c.id.to_string(),
                c.name.clone().unwrap_or_default(),
                c.peer.clone(),
                c.subscriptions.len().to_string(),
                format!("{ri:.0}"),
                format!("{ro:.0}"),
                c.pending_bytes.to_string(),
                drops(c).to_string(),
                format!("{rd:.0}"),
                if is_slow {
                    "SLOW".into()
                } else {
                    String::new()
                },
            ]);
            if is_slow {
                row.style(Style::default().add_modifier(Modifier::BOLD))
            } else {
                row
            }
        });
        let table = Table::new(
            rows,
            [
                Constraint::Length(6),
                Constraint::Length(16),
                Constraint::Min(16),
                Constraint::Length(5),
                Constraint::Length(9),
                Constraint::Length(9),
                Constraint::Length(10),
                Constraint::Length(9),
                Constraint::Length(8),
                Constraint::Length(5),
            ],
        )
        .header(
            Row::new([
                "id",
                "name",
                "address",
                "subs",
                "in/s",
                "out/s",
                "pending B",
                "dropped",
                "drop/s",
                "",
            ])
            .style(Style::default().add_modifier(Modifier::REVERSED)),
        )
        .block(Block::bordered().title(format!(" clients (sorted by {}) ", self.sort.name())));
        f.render_widget(table, clients);
        // Slow consumers: subscriptions that dropped in the last sample,
        // named by client and subscription.
        let mut lines = Vec::new();
        for c in &s.clients {
            let (_, _, rd) = r(c);
            if rd <= 0.0 {
                continue;
            }
            for sub in c.subscriptions.iter().filter(|s| s.counters.dropped > 0) {
                lines.push(Line::from(format!(
                    "client {} {}{} sub {} '{}' ({}): queued {}, dropped {}",
                    c.id,
                    c.name
                        .as_deref()
                        .map(|n| format!("{n} "))
                        .unwrap_or_default(),
                    c.peer,
                    sub.sid,
                    sub.pattern,
                    sub.policy,
                    sub.counters.queued,
                    sub.counters.dropped
                )));
            }
        }
        if lines.is_empty() {
            lines.push(Line::from("none"));
        }
        f.render_widget(
            Paragraph::new(lines).block(Block::bordered().title(" slow consumers ")),
            slow,
        );
        if let Some(m) = &s.mesh {
            let rows = m.peers.iter().map(|p| {
                Row::new(vec![
                    p.addr.to_string(),
                    match (p.up, p.suspect) {
                        (true, false) => "up",
                        (true, true) => "suspect",
                        _ => "down",
                    }
                    .into(),
                    p.patterns.to_string(),
                    p.sent_frames.to_string(),
                    p.recv_frames.to_string(),
                    p.lost.to_string(),
                ])
            });
            let t = Table::new(
                rows,
                [
                    Constraint::Min(22),
                    Constraint::Length(6),
                    Constraint::Length(9),
                    Constraint::Length(12),
                    Constraint::Length(12),
                    Constraint::Length(8),
                ],
            )
            .header(
                Row::new(["peer", "state", "patterns", "sent", "received", "lost"])
                    .style(Style::default().add_modifier(Modifier::REVERSED)),
            )
            .block(Block::bordered().title(format!(" mesh {} as {} ", m.net, m.me)));
            f.render_widget(t, mesh);
        }
        f.render_widget(
            Paragraph::new("sort: [p]ending [o]ut/s [i]n/s [d]rops [c]lient id   [q]uit"),
            keys,
        );
    }
}

/// Restores the terminal however `top` ends.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

pub(crate) fn run(a: TopArgs) -> Result<()> {
    if !(0.1..=3600.0).contains(&a.interval) {
        return Err("--interval: expected seconds from 0.1 to 3600".into());
    }
    let every = Duration::from_secs_f64(a.interval);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = rt.block_on(a.loc.connect_for("top", false))?;
    let me = client.id();
    let mut before = rt.block_on(client.stats())?;
    let mut at = Instant::now();
    if a.once {
        std::thread::sleep(every);
        let now = rt.block_on(client.stats())?;
        let v = View::new(&before, now, at.elapsed().as_secs_f64(), me, Sort::Drops);
        let mut t = Terminal::new(TestBackend::new(120, 40))?;
        t.draw(|f| v.draw(f))?;
        let buf = t.backend().buffer();
        for y in 0..buf.area.height {
            let line: String = (0..buf.area.width).map(|x| buf[(x, y)].symbol()).collect();
            crate::out::outln!("{}", line.trim_end());
        }
        return Ok(());
    }
    let mut term = ratatui::try_init()?;
    let _restore = Restore;
    let mut sort = Sort::Pending;
    let mut view = View::new(&before, before.clone(), 1.0, me, sort);
    loop {
        term.draw(|f| view.draw(f))?;
        let next = at + every;
        // Keys until the next sample.
        loop {
            let left = next.saturating_duration_since(Instant::now());
            if left.is_zero() || !event::poll(left)? {
                break;
            }
            if let Event::Key(k) = event::read()? {
                if k.kind != KeyEventKind::Press {
                    continue;
                }
                let new = match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(())
                    }
                    KeyCode::Char('p') => Sort::Pending,
                    KeyCode::Char('o') => Sort::Out,
                    KeyCode::Char('i') => Sort::In,
                    KeyCode::Char('d') => Sort::Drops,
                    KeyCode::Char('c') => Sort::Id,
                    _ => continue,
                };
                sort = new;
                view.sort = sort;
                term.draw(|f| view.draw(f))?;
            }
        }
        let now = rt.block_on(client.stats())?;
        let secs = at.elapsed().as_secs_f64();
        at = Instant::now();
        view = View::new(&before, now.clone(), secs, me, sort);
        before = now;
        let _ = term.backend_mut().flush();
    }
}
