package store

// The intent journal. Before a lifecycle step touches the kernel (isolate,
// update of an isolated container's ports, cleanup of an isolated one) it
// records its intent: the record in its transitional state. The journal
// is one append-only file, <state-dir>/intents.log (journal.go): an
// intent is one line appended with one write, and its removal another (a
// tombstone); the file is fsynced only before a record's removal is
// committed (see below), off the answer path. The outcome goes to the database
// (store.go), fsynced, and then the intent is removed. A stable state a
// caller is told about is written before the answer: in the database, or,
// for a Prepare and for the outcome of an Isolate or of a Cleanup of an
// isolated container, in the journal (the prepared record itself, or the
// intent from which recovery reaches that state: the plumbing complete,
// or gone), while the commit is queued and lands after the answer
// (preparedStored, isolatedStored, deleted). An intent costs one write
// system call instead of a database commit (two fsyncs).
//
// Why an intent needs no fsync: it protects kernel objects, and it is
// exactly as durable as they are. A daemon killed (kill -9, a crash) loses
// nothing written before: the bytes are in the page cache, and the next
// start reads them. Only a machine crash or power loss loses unsynced
// bytes, and that loses every kernel object an intent is about too (veths,
// filters, namespaces and the processes holding them, pins under /run,
// host port reservations): recovery then finds the database's stable
// state with nothing in the kernel, the outcome it would reach with the
// intent as well (an isolated or isolating container whose namespace is
// gone is cleaned up; a prepared one has nothing in the kernel). A
// prepared record whose commit a power loss cut short (within a commit's
// time of the answer) is lost with the processes of its container: the
// runtime that starts the container again prepares it again.
//
// What a power loss must not do is keep a later database and an earlier
// journal: the file's appended lines reach the disk when the kernel writes
// them back (up to ~30 s later), not with the database's fsyncs, so a
// removed container's intent whose tombstone was not written back would
// come back (a prepared one as a record, in a slot another container may
// hold since). So every commit that removes a record syncs the journal
// first (commitBatch): whatever the disk keeps of the database, it keeps
// the tombstones written before its removals.
//
// Every write of a record, to the database or to the journal, carries a
// sequence number from one counter that only grows (Store.nextSeq, started
// above every number on disk at open). At load an intent replaces the
// database's record only if that record exists and is older: an intent
// whose outcome reached the database before it was removed (a kill in
// between, or a power loss that kept the commit but not the removal), or
// one left of a container since cleaned up and prepared again, is stale
// and ignored. A prepared or isolating intent of a container with no
// record is its Prepare's record whose commit had not landed, and is
// loaded (overlay). A line that does not decode (a write cut short by a
// power loss or a full disk) is ignored: no kernel object outlived what
// cut it short, and the lines after it are read as usual.

// overlay replaces each record of recs by its container's intent when the
// intent is newer, and adds the intent of a container with no record when
// it says so (Entry.LoadAlone; the lifecycle's: prepared or isolating, its
// Prepare's commit had not landed). Such an intent is never stale: a
// cleanup replaces an isolating intent by its own, and removes a prepared
// one before the record. It returns the records and the IDs of those
// added (in the journal only).
func overlay[R any, P Entry[R]](recs, intents []P) (_ []P, added []string) {
	byID := make(map[string]int, len(recs))
	for i, r := range recs {
		byID[r.Key()] = i
	}
	for _, in := range intents {
		i, ok := byID[in.Key()]
		switch {
		case !ok && in.LoadAlone():
			recs = append(recs, in)
			added = append(added, in.Key())
		case !ok || in.Sequence() <= recs[i].Sequence():
			continue // stale: its outcome is in the database, or its container is gone
		default:
			recs[i] = in
		}
	}
	return recs, added
}
