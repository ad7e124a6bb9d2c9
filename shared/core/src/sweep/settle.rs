//! Settling the messages a pass held: waiting for the redrive that holds their record,
//! then judging them again.

use super::*;

/// How often [`settle_held`] looks again at items another run is redriving.
const SETTLE_POLL: Duration = Duration::from_millis(250);

/// What [`settle_held`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Messages deleted.
    pub deleted: usize,
    /// Messages given back at once because their record is to be reopened with their
    /// payload: a sweep that receives them (with their bodies) reopens it.
    pub to_reopen: usize,
}

/// Deletes the held messages whose records now say so ([`decide`]) and holds the rest for
/// `then` more (`Duration::ZERO`: visible again at once; after a pass that could not see
/// the whole DLQ, longer, so that the next runs reach the messages it did not see). Items
/// another run is redriving at this moment (a live lease; not one left by a run that died)
/// are looked at again every 250 ms, for at most `wait`, so that their messages are
/// deleted if that run resolves them. A message whose record should be reopened is given
/// back at once, for a sweep (which receives its body) to reopen. Leases are judged live
/// by the store's clock ([`RecordStore::clock`]), the one that stamped them.
pub async fn settle_held<D: DeadLetterQueue + RecordStore>(
    dlq: &D,
    held: BTreeMap<String, Vec<HeldMessage>>,
    wait: Duration,
    then: Duration,
) -> Result<Settled, ProcessError> {
    let clock = dlq.clock();
    let ids: Vec<String> = held.keys().cloned().collect();
    let give_up = Instant::now() + wait;
    // A lookup that fails leaves those messages kept, never deleted.
    let mut standings = if ids.is_empty() {
        HashMap::new()
    } else {
        dlq.standings(&ids).await.unwrap_or_default()
    };
    loop {
        let now = clock.now().timestamp();
        let busy: Vec<String> = ids
            .iter()
            .filter(|id| standings.get(*id).is_some_and(|s| s.leased_at(now)))
            .cloned()
            .collect();
        if busy.is_empty() || Instant::now() + SETTLE_POLL > give_up {
            break;
        }
        tokio::time::sleep(SETTLE_POLL).await;
        if let Ok(fresh) = dlq.standings(&busy).await {
            for id in &busy {
                standings.remove(id);
            }
            standings.extend(fresh);
        }
    }
    let mut delete = Vec::new();
    let mut reopen = Vec::new();
    let mut keep = Vec::new();
    for (item_id, messages) in held {
        for held in messages {
            match standings.get(&item_id).map(|s| decide(&held.view, Some(s))) {
                Some(MessageFate::Delete) => delete.push(held.receipt),
                Some(MessageFate::Reopen(_)) => reopen.push(held.receipt),
                _ => keep.push(held.receipt),
            }
        }
    }
    let deleted = dlq.delete_messages(&delete).await;
    // Given back (or held on) even when the deletes failed.
    let given_back = dlq.hold(&reopen, Duration::ZERO).await;
    let kept = dlq.hold(&keep, then).await;
    let deleted = deleted?;
    given_back?;
    kept?;
    Ok(Settled {
        deleted,
        to_reopen: reopen.len(),
    })
}
