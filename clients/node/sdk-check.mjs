// Runs S2's TypeScript SDK (@s2-dev/streamstore) against a server of S2's REST API v1 and prints
// one JSON line per check: {"check": name, "ok": true|false, "detail": ..., "error": ...}, then
// {"summary": {"passed": n, "failed": n}}. Exit code 0 when every check passed, 1 otherwise.
//
//   S2_ENDPOINT=http://127.0.0.1:7400 S2_ACCESS_TOKEN=s3cret node sdk-check.mjs [CHECK ...]
//
// Both the account and the basin endpoint are S2_ENDPOINT (path /v1); giving a basin endpoint
// makes the SDK name the basin in the `s2-basin` header. Each check has its own deadline
// (S2_CHECK_TIMEOUT_MS, default 15000) so a hanging session fails that check only. Retries are
// off (maxAttempts 1): a retried append could hide a failure or append twice.
import {
	AppendInput,
	AppendRecord,
	BatchTransform,
	FencingTokenMismatchError,
	Producer,
	RangeNotSatisfiableError,
	S2,
	S2Error,
	SeqNumMismatchError,
} from "@s2-dev/streamstore";

const endpoint = process.env.S2_ENDPOINT;
const token = process.env.S2_ACCESS_TOKEN ?? "";
if (!endpoint) {
	console.error("set S2_ENDPOINT (e.g. http://127.0.0.1:7400) and S2_ACCESS_TOKEN");
	process.exit(2);
}
const checkTimeoutMs = Number(process.env.S2_CHECK_TIMEOUT_MS ?? 15000);
const basinName = process.env.S2_BASIN ?? `sdk-check-${Date.now().toString(36)}`;
const options = (accessToken) => ({
	accessToken,
	endpoints: { account: endpoint, basin: endpoint },
	retry: { maxAttempts: 1 },
});
const s2 = new S2(options(token));
const basin = s2.basin(basinName);
const streamName = "orders";
const stream = basin.stream(streamName);
const decoder = new TextDecoder();

class CheckFailed extends Error {}

function expect(condition, message, detail) {
	if (!condition) {
		throw new CheckFailed(`${message}${detail === undefined ? "" : `: ${JSON.stringify(detail)}`}`);
	}
}

async function expectError(promise, errorClass, what) {
	try {
		await promise;
	} catch (error) {
		expect(
			error instanceof errorClass,
			`${what}: expected ${errorClass.name}, got ${error?.constructor?.name}`,
			{ message: error?.message, status: error?.status, code: error?.code },
		);
		return error;
	}
	throw new CheckFailed(`${what}: expected ${errorClass.name}, but it succeeded`);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const bodies = (batch) => batch.records.map((record) => record.body);

// State the checks share, in order (a later check relies on what an earlier one appended).
const state = { tail: 0 };

const checks = [
	["create_basin", async () => {
		const created = await s2.basins.create({ basin: basinName });
		const listed = await s2.basins.list({ prefix: basinName });
		const names = listed.basins.map((info) => info.name);
		expect(names.includes(basinName), "the new basin is listed", names);
		return { created };
	}],
	["create_stream", async () => {
		await basin.streams.create({ stream: streamName });
		const listed = await basin.streams.list({ prefix: streamName });
		const names = listed.streams.map((info) => info.name);
		expect(names.includes(streamName), "the new stream is listed", names);
		return { names };
	}],
	["create_stream_exists", async () => {
		const error = await expectError(
			basin.streams.create({ stream: streamName }), S2Error, "creating it again");
		expect(error.status === 409, "409 for an existing stream", error.status);
		return { status: error.status, code: error.code };
	}],
	["append", async () => {
		const ack = await stream.append(AppendInput.create([
			AppendRecord.string({ body: "a", headers: [["kind", "first"]] }),
			AppendRecord.string({ body: "b" }),
		]));
		expect(ack.start.seqNum === 0 && ack.end.seqNum === 2, "acked [0, 2)", ack);
		expect(ack.tail.seqNum === 2, "tail 2", ack);
		state.tail = 2;
		return { ack };
	}],
	["append_bytes", async () => {
		// A batch with a bytes record goes as application/protobuf (unary).
		const ack = await stream.append(AppendInput.create([
			AppendRecord.bytes({ body: new Uint8Array([0, 1, 255]) }),
		]));
		expect(ack.start.seqNum === 2 && ack.end.seqNum === 3, "acked [2, 3)", ack);
		state.tail = 3;
		return { ack };
	}],
	["append_match_seq_num", async () => {
		const ack = await stream.append(AppendInput.create(
			[AppendRecord.string({ body: "c" })], { matchSeqNum: 3 }));
		expect(ack.start.seqNum === 3, "acked at 3", ack);
		state.tail = 4;
		return { ack };
	}],
	["append_match_seq_num_mismatch", async () => {
		const error = await expectError(
			stream.append(AppendInput.create([AppendRecord.string({ body: "x" })], { matchSeqNum: 0 })),
			SeqNumMismatchError, "matchSeqNum 0 on a stream at 4");
		expect(error.expectedSeqNum === 4, "expectedSeqNum is the tail", error.expectedSeqNum);
		expect(error.status === 412, "412", error.status);
		return { expectedSeqNum: error.expectedSeqNum };
	}],
	["fence", async () => {
		const ack = await stream.append(AppendInput.create([AppendRecord.fence("t1")]));
		expect(ack.start.seqNum === 4, "the fence command record is at 4", ack);
		const fenced = await stream.append(AppendInput.create(
			[AppendRecord.string({ body: "d" })], { fencingToken: "t1" }));
		expect(fenced.start.seqNum === 5, "an append carrying the token is acked at 5", fenced);
		state.tail = 6;
		return { ack, fenced };
	}],
	["fence_wrong_token", async () => {
		const error = await expectError(
			stream.append(AppendInput.create([AppendRecord.string({ body: "x" })], { fencingToken: "t0" })),
			FencingTokenMismatchError, "an append carrying another token");
		expect(error.expectedFencingToken === "t1", "expectedFencingToken is t1", error.expectedFencingToken);
		const tail = await stream.checkTail();
		expect(tail.tail.seqNum === 6, "nothing appended", tail);
		return { expectedFencingToken: error.expectedFencingToken };
	}],
	["check_tail", async () => {
		const tail = await stream.checkTail();
		expect(tail.tail.seqNum === state.tail, `tail ${state.tail}`, tail);
		expect(tail.tail.timestamp > 0, "a timestamp", tail);
		return { tail };
	}],
	["read_seq_num", async () => {
		const batch = await stream.read({ start: { from: { seqNum: 0 } }, stop: { limits: { count: 2 } } });
		expect(JSON.stringify(bodies(batch)) === '["a","b"]', "bodies a, b", bodies(batch));
		const [first] = batch.records;
		expect(first.seqNum === 0, "seqNum 0", first);
		expect(JSON.stringify(first.headers) === '[["kind","first"]]', "headers kept", first.headers);
		return { records: batch.records.length };
	}],
	["read_bytes", async () => {
		// as: "bytes" reads application/protobuf (unary).
		const batch = await stream.read(
			{ start: { from: { seqNum: 2 } }, stop: { limits: { count: 1 } } }, { as: "bytes" });
		const body = Array.from(batch.records[0]?.body ?? []);
		expect(JSON.stringify(body) === "[0,1,255]", "the bytes read back", body);
		return { body };
	}],
	["read_tail_offset", async () => {
		const batch = await stream.read({ start: { from: { tailOffset: 1 } } });
		expect(batch.records.length === 1, "one record before the tail", bodies(batch));
		expect(batch.records[0].seqNum === state.tail - 1 && batch.records[0].body === "d",
			"the last record", batch.records[0]);
		return { seqNum: batch.records[0].seqNum };
	}],
	["read_timestamp", async () => {
		const all = await stream.read({ start: { from: { seqNum: 0 } } });
		const target = all.records[3];
		const batch = await stream.read({ start: { from: { timestamp: target.timestamp } } });
		const first = batch.records[0];
		expect(first && first.timestamp >= target.timestamp && first.seqNum <= target.seqNum,
			"the first record at or after the timestamp", { target, first });
		return { target: target.timestamp, first: first.seqNum };
	}],
	["read_beyond_tail", async () => {
		const error = await expectError(
			stream.read({ start: { from: { seqNum: state.tail + 10 } } }),
			RangeNotSatisfiableError, "reading past the tail");
		expect(error.status === 416, "416", error.status);
		return { status: error.status, tail: error.tail };
	}],
	["read_long_poll", async () => {
		const started = Date.now();
		const read = stream.read({ start: { from: { seqNum: state.tail } }, stop: { waitSecs: 10 } });
		read.catch(() => {}); // awaited below; this only keeps an early failure from being unhandled
		await sleep(300);
		await stream.append(AppendInput.create([AppendRecord.string({ body: "late" })]));
		const batch = await read;
		const elapsed = Date.now() - started;
		expect(bodies(batch).includes("late"), "the long poll returns the new record", bodies(batch));
		expect(elapsed < 8000, "well before waitSecs", elapsed);
		state.tail += 1;
		return { elapsedMs: elapsed };
	}],
	["read_long_poll_empty", async () => {
		const started = Date.now();
		const batch = await stream.read({ start: { from: { seqNum: state.tail } }, stop: { waitSecs: 1 } });
		const elapsed = Date.now() - started;
		expect(batch.records.length === 0, "nothing new", bodies(batch));
		expect(elapsed >= 900, "waited about waitSecs", elapsed);
		return { elapsedMs: elapsed };
	}],
	["trim", async () => {
		const ack = await stream.append(AppendInput.create([AppendRecord.trim(2)]));
		state.tail = ack.end.seqNum;
		const batch = await stream.read({ start: { from: { seqNum: 0 } } });
		const first = batch.records[0];
		expect(first && first.seqNum >= 2, "records before 2 are gone", first);
		return { ack, first: first.seqNum };
	}],
	...["s2s", "fetch"].flatMap((transport) => {
		const session = basin.stream(streamName, { forceTransport: transport });
		return [
			[`append_session_${transport}`, async () => {
				const appender = await session.appendSession();
				const tickets = [];
				for (const body of ["s1", "s2", "s3"]) {
					tickets.push(await appender.submit(AppendInput.create([AppendRecord.string({ body })])));
				}
				const acks = await Promise.all(tickets.map((ticket) => ticket.ack()));
				await appender.close();
				const starts = acks.map((ack) => ack.start.seqNum);
				expect(starts[1] === starts[0] + 1 && starts[2] === starts[0] + 2,
					"acks in order, one record each", starts);
				state.tail = acks[2].end.seqNum;
				return { starts };
			}],
			[`producer_${transport}`, async () => {
				const producer = new Producer(new BatchTransform(), await session.appendSession());
				const tickets = [];
				for (let i = 0; i < 10; i++) {
					tickets.push(await producer.submit(AppendRecord.string({ body: `p${i}` })));
				}
				const acks = await Promise.all(tickets.map((ticket) => ticket.ack()));
				await producer.close();
				const seqNums = acks.map((ack) => ack.seqNum());
				expect(seqNums.every((seq, i) => seq === seqNums[0] + i), "consecutive seqNums", seqNums);
				state.tail = seqNums[9] + 1;
				return { first: seqNums[0] };
			}],
			[`read_session_${transport}`, async () => {
				const from = state.tail - 10;
				const reader = await session.readSession({
					start: { from: { seqNum: from } }, stop: { limits: { count: 10 } } });
				const seen = [];
				for await (const record of reader) {
					seen.push(record.body);
				}
				expect(JSON.stringify(seen) === JSON.stringify([...Array(10).keys()].map((i) => `p${i}`)),
					"the producer's records", seen);
				return { records: seen.length };
			}],
			[`read_session_follow_${transport}`, async () => {
				const reader = await session.readSession({ start: { from: { seqNum: state.tail } } });
				const body = `follow-${transport}`;
				setTimeout(() => {
					stream.append(AppendInput.create([AppendRecord.string({ body })])).catch(() => {});
				}, 300);
				for await (const record of reader) {
					expect(record.body === body && record.seqNum === state.tail, "the new record", record);
					break;
				}
				await reader.cancel?.();
				state.tail += 1;
				return { seqNum: state.tail - 1 };
			}],
		];
	}),
	["read_count_zero", async () => {
		const batch = await stream.read({ start: { from: { seqNum: 0 } }, stop: { limits: { count: 0 } } });
		expect(batch.records.length === 0, "count 0 reads no record", bodies(batch));
		return {};
	}],
	["reconfigure_basin", async () => {
		const changed = await s2.basins.reconfigure({ basin: basinName, createStreamOnRead: true });
		expect(changed.createStreamOnRead === true, "createStreamOnRead set", changed);
		expect(changed.createStreamOnAppend === false, "createStreamOnAppend kept", changed);
		const config = await s2.basins.getConfig({ basin: basinName });
		expect(config.createStreamOnRead === true, "the change is kept", config);
		const back = await s2.basins.reconfigure({ basin: basinName, createStreamOnRead: false });
		expect(back.createStreamOnRead === false, "and changed back", back);
		return { changed };
	}],
	["stream_config", async () => {
		// A stream's own configuration: kept as set (storage class included), changed in part,
		// and enforced (client-require refuses an append without a timestamp).
		const name = "configured";
		await basin.streams.create({
			stream: name,
			config: {
				storageClass: "standard",
				retentionPolicy: { ageSecs: 3600 },
				timestamping: { mode: "client-require", uncapped: true },
				deleteOnEmpty: { minAgeSecs: 600 },
			},
		});
		try {
			const config = await basin.streams.getConfig({ stream: name });
			expect(config.storageClass === "standard", "the storage class is kept", config);
			expect(config.retentionPolicy?.ageSecs === 3600, "the retention is kept", config);
			expect(
				config.timestamping?.mode === "client-require" && config.timestamping?.uncapped === true,
				"the timestamping is kept", config);
			expect(config.deleteOnEmpty?.minAgeSecs === 600, "delete-on-empty is kept", config);
			await basin.streams.reconfigure({ stream: name, retentionPolicy: { infinite: {} } });
			const after = await basin.streams.getConfig({ stream: name });
			expect("infinite" in (after.retentionPolicy ?? {}), "the retention is now infinite", after);
			expect(after.storageClass === "standard", "a partial change keeps the rest", after);
			const configured = basin.stream(name);
			const error = await expectError(
				configured.append(AppendInput.create([AppendRecord.string({ body: "no timestamp" })])),
				S2Error, "an append without a timestamp under client-require");
			expect(error.status === 422, "422 for a missing timestamp", error.status);
			const future = Date.now() + 3_600_000;
			const ack = await configured.append(AppendInput.create([
				AppendRecord.string({ body: "stamped", timestamp: future }),
			]));
			expect(ack.start.seqNum === 0, "a stamped append is acked", ack);
			const batch = await configured.read({ start: { from: { seqNum: 0 } } });
			const stamp = batch.records[0]?.timestamp?.getTime();
			expect(stamp === future, "uncapped keeps the future timestamp", { stamp, future });
			return { config: after };
		} finally {
			await basin.streams.delete({ stream: name });
		}
	}],
	["utf8_stream_name", async () => {
		const name = "日本語/ストリーム 🙂";
		await basin.streams.create({ stream: name });
		const utf8 = basin.stream(name);
		const ack = await utf8.append(AppendInput.create([AppendRecord.string({ body: "u" })]));
		expect(ack.start.seqNum === 0, "appended", ack);
		const batch = await utf8.read({ start: { from: { seqNum: 0 } } });
		expect(JSON.stringify(bodies(batch)) === '["u"]', "read back", bodies(batch));
		const listed = await basin.streams.list({ prefix: "日本語/" });
		const names = listed.streams.map((info) => info.name);
		expect(JSON.stringify(names) === JSON.stringify([name]), "listed by its prefix", names);
		await basin.streams.delete({ stream: name });
		return { names };
	}],
	...["aegis-256", "aes-256-gcm"].map((cipher) => [`encryption_${cipher}`, async () => {
		const encryptedBasin = `${basinName}-${cipher === "aegis-256" ? "ae" : "gc"}`;
		await s2.basins.create({ basin: encryptedBasin, config: { streamCipher: cipher } });
		try {
			const scoped = s2.basin(encryptedBasin);
			const created = await scoped.streams.create({ stream: "vault" });
			expect(created.cipher === cipher, "the stream's cipher", created);
			const key = crypto.getRandomValues(new Uint8Array(32));
			const keyed = scoped.stream("vault", { encryptionKey: key });
			await keyed.append(AppendInput.create([AppendRecord.string({ body: "secret" })]));
			const batch = await keyed.read({ start: { from: { seqNum: 0 } } });
			expect(JSON.stringify(bodies(batch)) === '["secret"]', "read back with the key", bodies(batch));
			const missing = await expectError(
				scoped.stream("vault").read({ start: { from: { seqNum: 0 } } }), S2Error, "no key");
			expect(missing.status === 400 && missing.code === "bad_header", "400 bad_header",
				{ status: missing.status, code: missing.code });
			const other = scoped.stream("vault", { encryptionKey: crypto.getRandomValues(new Uint8Array(32)) });
			const wrong = await expectError(
				other.read({ start: { from: { seqNum: 0 } } }), S2Error, "another key");
			expect(wrong.code === "decryption_failed", "decryption_failed", { code: wrong.code });
			return { cipher };
		} finally {
			await s2.basins.delete({ basin: encryptedBasin });
		}
	}]),
	// gzip only: the SDK's zstd needs Node.js 22.15+ (zlib's zstd), and this machine has 20.
	...["gzip"].map((compression) => [`compressed_session_${compression}`, async () => {
		const compressed = new S2({ ...options(token), compression });
		const scoped = compressed.basin(basinName).stream(streamName, { forceTransport: "s2s" });
		const appender = await scoped.appendSession();
		const body = `${compression}-`.repeat(1000);
		const ticket = await appender.submit(AppendInput.create([AppendRecord.string({ body })]));
		const ack = await ticket.ack();
		await appender.close();
		const reader = await scoped.readSession({
			start: { from: { seqNum: ack.start.seqNum } }, stop: { limits: { count: 1 } } });
		const seen = [];
		for await (const record of reader) {
			seen.push(record.body);
		}
		expect(seen.length === 1 && seen[0] === body, "the compressed record read back", seen.length);
		state.tail = ack.end.seqNum;
		return { seqNum: ack.start.seqNum };
	}]),
	["error_stream_not_found", async () => {
		const error = await expectError(
			basin.stream("no-such-stream").append(AppendInput.create([AppendRecord.string({ body: "x" })])),
			S2Error, "appending to a stream that does not exist");
		expect(error.status === 404, "404", { status: error.status, code: error.code });
		return { status: error.status, code: error.code };
	}],
	["error_wrong_token", async () => {
		const stranger = new S2(options(`${token}-wrong`));
		const error = await expectError(stranger.basins.list(), S2Error, "a wrong access token");
		expect(error.status === 401 || error.status === 403, "401 or 403", error.status);
		return { status: error.status, code: error.code };
	}],
	["error_bad_basin_name", async () => {
		await expectError(Promise.resolve().then(() => s2.basin("NO")), S2Error, "an invalid basin name");
		return {};
	}],
	["delete_stream", async () => {
		await basin.streams.delete({ stream: streamName });
		const listed = await basin.streams.list({ prefix: streamName });
		const live = listed.streams.filter((info) => info.name === streamName && !info.deletedAt);
		expect(live.length === 0, "the stream is gone (or marked deleted)", listed.streams);
		return {};
	}],
];

// A promise a failed check left behind must not end the run: later checks still report.
process.on("unhandledRejection", (error) => {
	console.error(`unhandled rejection: ${error?.message ?? error}`);
});

const wanted = new Set(process.argv.slice(2));
let passed = 0;
let failed = 0;
for (const [name, run] of checks) {
	if (wanted.size && !wanted.has(name)) continue;
	let timer;
	const started = Date.now();
	try {
		const detail = await Promise.race([
			run(),
			new Promise((_, reject) => {
				timer = setTimeout(() => reject(new CheckFailed(`no answer within ${checkTimeoutMs} ms`)), checkTimeoutMs);
			}),
		]);
		passed += 1;
		console.log(JSON.stringify({ check: name, ok: true, ms: Date.now() - started, detail }));
	} catch (error) {
		failed += 1;
		console.log(JSON.stringify({
			check: name,
			ok: false,
			ms: Date.now() - started,
			error: `${error?.constructor?.name}: ${error?.message}`,
			status: error?.status,
			code: error?.code,
		}));
	} finally {
		clearTimeout(timer);
	}
}
console.log(JSON.stringify({ summary: { passed, failed, basin: basinName } }));
await stream.close?.();
process.exit(failed ? 1 : 0);
