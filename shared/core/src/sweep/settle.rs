//! Settling the messages a pass held: waiting for the redrive that holds their record,
//! then judging them again.

use super::*;

/// How often [`settle_held`] looks again at items another run is redriving.
const SETTLE_POLL: Duration = Duration::from_millis(250);

/// Items settled per round: one standings read (DynamoDB's `BatchGetItem` takes 100), then
/// their deletes and holds. A settling that must end by an instant checks it between two.
const SETTLE_CHUNK: usize = 100;

/// What [`settle_held`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Messages deleted.
    pub deleted: usize,
    /// Messages given back at once because their record is to be reopened with their
    /// payload: a sweep that receives them (with their bodies) reopens it.
    pub to_reopen: usize,
    /// Messages left as they were held when the settling reached its end (`until`): they
    /// come back when their hold lapses, and the next sweep judges them.
    pub left_held: usize,
}

/// Deletes the held messages whose records now say so ([`decide`]) and holds the rest for
/// `then` more (`Duration::ZERO`: visible again at once; after a pass that could not see
/// the whole DLQ, longer, so that the next runs reach the messages it did not see). Items
/// another run is redriving at this moment (a live lease; not one left by a run that died)
/// are looked at again every 250 ms, for at most `wait`, so that their messages are
/// deleted if that run resolves them. A message whose record should be reopened is given
/// back at once, for a sweep (which receives its body) to reopen. Leases are judged live
/// by the store's clock ([`RecordStore::clock`]), the one that stamped them.
///
/// The items are settled a hundred at a time, and none is started at or after
/// `until`. What is left stays held until its hold lapses: a settling cut short loses
/// nothing, and a 10,000-message DLQ cannot run a redrive past its deadline.
pub async fn settle_held<D: DeadLetterQueue + RecordStore>(
    dlq: &D,
    held: BTreeMap<String, Vec<HeldMessage>>,
    wait: Duration,
    then: Duration,
    until: Option<Instant>,
) -> Result<Settled, ProcessError> {
    let mut settled = Settled::default();
    let give_up = Instant::now() + wait;
    let items: Vec<(String, Vec<HeldMessage>)> = held.into_iter().collect();
    let mut chunks = items.chunks(SETTLE_CHUNK);
    for chunk in chunks.by_ref() {
        if until.is_some_and(|u| Instant::now() >= u) {
            settled.left_held += chunk.iter().map(|(_, m)| m.len()).sum::<usize>();
            break;
        }
        let round = settle_chunk(dlq, chunk, give_up, then).await?;
        settled.deleted += round.deleted;
        settled.to_reopen += round.to_reopen;
    }
    settled.left_held += chunks
        .flat_map(|chunk| chunk.iter().map(|(_, m)| m.len()))
        .sum::<usize>();
    Ok(settled)
}

/// Settles one chunk of items ([`settle_held`]): waits for the live redrives among them
/// until `give_up`, then deletes, gives back or holds their messages.
async fn settle_chunk<D: DeadLetterQueue + RecordStore>(
    dlq: &D,
    chunk: &[(String, Vec<HeldMessage>)],
    give_up: Instant,
    then: Duration,
) -> Result<Settled, ProcessError> {
    let clock = dlq.clock();
    let ids: Vec<String> = chunk.iter().map(|(id, _)| id.clone()).collect();
    // A lookup that fails leaves those messages kept, never deleted.
    let mut standings = dlq.standings(&ids).await.unwrap_or_default();
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
    for (item_id, messages) in chunk {
        for held in messages {
            match standings.get(item_id).map(|s| decide(&held.view, Some(s))) {
                Some(MessageFate::Delete) => delete.push(held.receipt.clone()),
                Some(MessageFate::Reopen(_)) => reopen.push(held.receipt.clone()),
                _ => keep.push(held.receipt.clone()),
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
        left_held: 0,
    })
}
