-- Shadow eviction: candidate eviction policies run on metadata-only radix
-- trees (token ids and block accounting, no KV) fed by the live request
-- stream, so an operator sees each candidate's hit rate beside the live
-- one before switching.
--
--   local shadow = require "tinyloop.policy.shadow"
--   local sh = shadow.new{ capacity_blocks = 512, block_size = 16,
--                          policies = { lru = v_lru, cost = v_cost } }   -- policy versions
--   sh:pin(tokens, { salt = 0, shareable = true })    -- registered prefixes
--   sh:feed(prompt, output, { salt = s, tenant = t, cached = live_n_cached })
--   sh:report() -> { live = {...}, lru = { hit_rate, hit_tokens, ... }, ... }
--
-- A Sim mirrors the engine's rules: namespaces by salt (shareable pinned
-- entries visible to every salt), token-granular longest match, prompt +
-- output inserted after each request, leaves evicted lowest score first
-- until the blocks fit. Scores come from the policy's weights (what C would
-- apply) or, with mode = "score", from its score(node) function.
local policy = require "tinyloop.policy"

local _M = {}

local Sim = {}
local sim_mt = { __index = Sim }
_M.Sim_mt = sim_mt

local ceil, floor, huge = math.ceil, math.floor, math.huge


local function new_node(parent, toks, i, j, start)
    local t = {}
    for k = i, j do
        t[#t + 1] = toks[k]
    end
    return { parent = parent, toks = t, start = start, children = {}, nchild = 0, hits = 0, last_access = 0,
             pinned = false, tenant = 0, shareable = false }
end


-- new_sim{ capacity_blocks, block_size = 16, policy = version | weights
-- table | function(node) -> score, mode = "weights" | "score" }
function _M.new_sim(opts)
    local self = setmetatable({
        cap = opts.capacity_blocks or huge, bs = opts.block_size or 16, policy = opts.policy,
        mode = opts.mode, roots = {}, used = 0, clock = 0, next_id = 0, refs = {}, next_block = 0,
        lookups = 0, hits = 0, hit_tokens = 0, prompt_tokens = 0, evictions = 0, evicted_tokens = 0,
        failed_scores = 0,
    }, sim_mt)
    local p = opts.policy
    if policy.is_version(p) then
        local w = p:get("weights")
        if p:has("score") and (self.mode == "score" or not w) then
            self.score = function(n)
                local ok, s = p:call("score", n)
                if ok and type(s) == "number" and s == s then
                    return s
                end
                self.failed_scores = self.failed_scores + 1
                return n.last_access
            end
        else
            self.weights = w
        end
    elseif type(p) == "function" then
        self.score = p
    else
        self.weights = p or { recency = 1 }
    end
    return self
end


-- Block references, as the engine's KV: a block is in use while a node
-- (or the request running) references it.
function Sim:_ref(id, d)
    local r = (self.refs[id] or 0) + d
    if r <= 0 then
        self.refs[id] = nil
        self.used = self.used - 1
    else
        if not self.refs[id] then
            self.used = self.used + 1
        end
        self.refs[id] = r
    end
end


-- ids_along(path) -> logical block -> id of the blocks a matched path holds.
local function ids_along(path)
    local m = {}
    for _, nd in ipairs(path) do
        for i, id in ipairs(nd.ids or {}) do
            m[nd.lb_first + i - 1] = m[nd.lb_first + i - 1] or id
        end
    end
    return m
end


function Sim:_root(ns)
    local r = self.roots[ns]
    if not r then
        r = { toks = {}, start = 0, children = {}, nchild = 0, root = true }
        self.roots[ns] = r
    end
    return r
end


-- How many of an edge's tokens ct equal toks[pos ..] (up to index n).
local function common_len(ct, toks, pos, n)
    local k = 0
    while k < #ct and pos + k <= n and ct[k + 1] == toks[pos + k] do
        k = k + 1
    end
    return k
end

-- Walks the longest match of toks (at most limit tokens) under root;
-- returns matched length and the nodes passed (the last maybe partially).
local function walk(root, toks, only_shareable, limit)
    local node, pos, path = root, 1, {}
    local n = limit or #toks
    while pos <= n do
        local c = node.children[toks[pos]]
        if not c or (only_shareable and not c.shareable) then
            break
        end
        local ct = c.toks
        local k = common_len(ct, toks, pos, n)
        path[#path + 1] = c
        pos = pos + k
        if k < #ct then
            break
        end
        node = c
    end
    return pos - 1, path
end


-- lookup(toks, salt) -> matched tokens, at most #toks - 1 (the engine
-- computes the last prompt token's logits). Touches the nodes it passes as
-- the engine does: each gets a hit and the next tick of the cache clock.
function Sim:lookup(toks, salt)
    salt = salt or 0
    local m, path = walk(self:_root(salt), toks, false, #toks - 1)
    for _, nd in ipairs(path) do
        self.clock = self.clock + 1
        nd.hits = nd.hits + 1
        nd.last_access = self.clock
    end
    if salt ~= 0 then
        local ms, spath = walk(self:_root(0), toks, true, #toks - 1)
        for _, nd in ipairs(spath) do
            self.clock = self.clock + 1
            nd.hits = nd.hits + 1
            nd.last_access = self.clock
        end
        if ms > m then
            m, path = ms, spath
        end
    end
    return m, path
end


-- peek(toks, salt) -> matched tokens, touching nothing (routing).
function Sim:peek(toks, salt)
    salt = salt or 0
    local m = walk(self:_root(salt), toks, false)
    if salt ~= 0 then
        m = math.max(m, (walk(self:_root(0), toks, true)))
    end
    return m
end


-- insert(toks, salt, opts{ pinned, tenant, shareable, skip }) -> the leaf.
-- opts.skip: tokens served by a shared entry (their blocks are not charged).
function Sim:insert(toks, salt, o)
    o = o or {}
    local node, pos, n = self:_root(salt or 0), 1, #toks
    while pos <= n do
        self.clock = self.clock + 1
        local c = node.children[toks[pos]]
        if not c then
            local leaf = new_node(node, toks, pos, n, pos - 1)
            self.next_id = self.next_id + 1
            leaf.id, leaf.tenant, leaf.shareable = self.next_id, o.tenant or 0, o.shareable or false
            leaf.last_access = self.clock
            node.children[toks[pos]] = leaf
            node.nchild = node.nchild + 1
            -- The leaf's blocks come from the request's block table: those
            -- of a shareable prefix it reused (o.shared: logical block ->
            -- id), otherwise its own (a block it started inside was copied
            -- on write, so it is its own too).
            local ids = {}
            local first = floor(leaf.start / self.bs)
            for lb = first, floor((n - 1) / self.bs) do
                local id = o.shared and o.shared[lb]
                if not id then
                    self.next_block = self.next_block + 1
                    id = self.next_block
                end
                ids[#ids + 1] = id
                self:_ref(id, 1)
            end
            leaf.lb_first, leaf.ids = first, ids
            node = leaf
            break
        end
        local ct = c.toks
        local k = common_len(ct, toks, pos, n)
        if k < #ct then
            -- split c at k: head keeps the first k tokens
            local head = new_node(node, ct, 1, k, c.start)
            self.next_id = self.next_id + 1
            head.id, head.hits, head.tenant, head.shareable = self.next_id, c.hits, c.tenant, c.shareable
            head.last_access, head.pinned = c.last_access, c.pinned
            local rest = {}
            for i = k + 1, #ct do
                rest[#rest + 1] = ct[i]
            end
            c.toks, c.start, c.parent = rest, c.start + k, head
            head.children[rest[1]] = c
            head.nchild = 1
            node.children[toks[pos]] = head
            -- head refs the blocks overlapping its range; c drops those
            -- before its new start (the boundary block is held by both)
            local ids, first = c.ids, c.lb_first
            local hids = {}
            for lb = first, floor((head.start + k - 1) / self.bs) do
                hids[#hids + 1] = ids[lb - first + 1]
                self:_ref(ids[lb - first + 1], 1)
            end
            head.ids, head.lb_first = hids, first
            local nf = floor(c.start / self.bs)
            local cids = {}
            for lb = first, first + #ids - 1 do
                if lb < nf then
                    self:_ref(ids[lb - first + 1], -1)
                else
                    cids[#cids + 1] = ids[lb - first + 1]
                end
            end
            c.ids, c.lb_first = cids, nf
            self.clock = self.clock + 1
            c = head
        end
        c.last_access = self.clock
        if o.pinned then
            c.pinned = true
        end
        pos = pos + k
        node = c
    end
    if o.pinned then
        node.pinned = true
    end
    if not o.no_evict then
        self:_evict(0)
    end
    return node
end


function Sim:_score(nd)
    local w = self.weights
    if w then
        return (w.recency or 0) * nd.last_access + (w.hits or 0) * nd.hits + (w.tokens or 0) * #nd.toks
            + (w.depth or 0) * nd.start
    end
    return self.score {
        id = nd.id, start = nd.start, n_tokens = #nd.toks, tokens = #nd.toks, n_blocks = #nd.ids,
        hits = nd.hits, last_access = nd.last_access, depth = nd.start, tenant = nd.tenant, pinned = nd.pinned,
        locked = false, leaf = true, shareable = nd.shareable, cost = nd.start + #nd.toks, now = self.clock,
    }
end


function Sim:_leaves()
    local out = {}
    local function rec(nd)
        if nd.nchild == 0 then
            if not nd.root and not nd.pinned and not nd.locked then
                out[#out + 1] = nd
            end
            return
        end
        for _, c in pairs(nd.children) do
            rec(c)
        end
    end
    for _, r in pairs(self.roots) do
        rec(r)
    end
    return out
end


-- Evicts until `extra` more blocks fit.
function Sim:_evict(extra)
    if self.used + extra <= self.cap then
        return
    end
    local leaves = self:_leaves()
    local scored = {}
    for i, nd in ipairs(leaves) do
        scored[i] = { nd = nd, s = self:_score(nd) }
    end
    table.sort(scored, function(a, b) return a.s < b.s end)
    local i = 1
    while self.used + extra > self.cap do
        local e = scored[i]
        if not e then
            leaves = self:_leaves()     -- parents freed by the evictions so far
            if #leaves == 0 then
                return
            end
            scored = {}
            for j, nd in ipairs(leaves) do
                scored[j] = { nd = nd, s = self:_score(nd) }
            end
            table.sort(scored, function(a, b) return a.s < b.s end)
            i = 1
            e = scored[1]
        end
        local nd = e.nd
        local p = nd.parent
        p.children[nd.toks[1]] = nil
        p.nchild = p.nchild - 1
        for _, id in ipairs(nd.ids) do
            self:_ref(id, -1)
        end
        self.evictions = self.evictions + 1
        self.evicted_tokens = self.evicted_tokens + #nd.toks
        -- a parent left without children competes in this round too, in
        -- score order (the engine's tl_radix_evict)
        if p.nchild == 0 and not p.root and not p.pinned and not p.locked then
            local s, j = self:_score(p), i + 1
            while scored[j] and scored[j].s <= s do
                j = j + 1
            end
            table.insert(scored, j, { nd = p, s = s })
        end
        i = i + 1
    end
end


-- request(prompt, output, { salt, tenant }) -> matched tokens: one
-- request as the engine runs it: match (at most #prompt - 1 tokens) and
-- lock the match, evict for the blocks the rest needs, insert prompt +
-- output, unlock.
function Sim:request(prompt, output, o)
    o = o or {}
    local m, path = self:lookup(prompt, o.salt)
    local locked = {}
    local nd = path[#path]
    while nd and not nd.root do
        nd.locked = true
        locked[#locked + 1] = nd
        nd = nd.parent
    end
    self.lookups = self.lookups + 1
    self.prompt_tokens = self.prompt_tokens + #prompt
    if m > 0 then
        self.hits = self.hits + 1
        self.hit_tokens = self.hit_tokens + m
    end
    -- the engine caches the positions it computed: prompt + output but
    -- the last output token (sampled, never fed back)
    local full = prompt
    if output and #output > 1 then
        full = {}
        for i = 1, #prompt do
            full[i] = prompt[i]
        end
        for i = 1, #output - 1 do
            full[#prompt + i] = output[i]
        end
    end
    local shared, spath = 0, nil
    if (o.salt or 0) ~= 0 then
        shared, spath = walk(self:_root(0), full, true)
    end
    local from = math.max(m, shared)
    self:_evict(ceil(#full / self.bs) - floor(from / self.bs))
    local sids
    if shared > 0 then
        sids = {}
        for lb, id in pairs(ids_along(spath)) do
            if (lb + 1) * self.bs <= shared then
                sids[lb] = id
            end
        end
    end
    self:insert(full, o.salt, { tenant = o.tenant, shared = sids, no_evict = true })
    for _, x in ipairs(locked) do
        x.locked = nil
    end
    return m
end


function Sim:stats()
    return {
        lookups = self.lookups, hits = self.hits, hit_tokens = self.hit_tokens,
        prompt_tokens = self.prompt_tokens, evictions = self.evictions, evicted_tokens = self.evicted_tokens,
        blocks_used = self.used,
        hit_rate = self.prompt_tokens > 0 and self.hit_tokens / self.prompt_tokens or 0,
        request_hit_rate = self.lookups > 0 and self.hits / self.lookups or 0,
        failed_scores = self.failed_scores,
    }
end


-- ---- a set of shadows beside the live cache ------------------------------------------------

local Shadow = {}
local shadow_mt = { __index = Shadow }


-- new{ capacity_blocks, block_size, policies = { name = version | weights | fn }, mode }
function _M.new(opts)
    local self = setmetatable({ sims = {}, names = {}, live = { lookups = 0, hits = 0, hit_tokens = 0,
        prompt_tokens = 0 }, opts = opts }, shadow_mt)
    for name, p in pairs(opts.policies or {}) do
        self:add(name, p)
    end
    return self
end


function Shadow:add(name, p, mode)
    self.sims[name] = _M.new_sim { capacity_blocks = self.opts.capacity_blocks, block_size = self.opts.block_size,
        policy = p, mode = mode or self.opts.mode }
    self.names[#self.names + 1] = name
    table.sort(self.names)
end


function Shadow:pin(toks, o)
    o = o or {}
    for _, s in pairs(self.sims) do
        s:insert(toks, o.salt or 0, { pinned = true, shareable = o.shareable, tenant = o.tenant })
    end
end


-- feed(prompt, output, { salt, tenant, cached }): cached is the live
-- engine's n_cached for the request, so the live hit rate sits beside.
function Shadow:feed(prompt, output, o)
    o = o or {}
    for _, s in pairs(self.sims) do
        s:request(prompt, output, o)
    end
    local l = self.live
    l.lookups = l.lookups + 1
    l.prompt_tokens = l.prompt_tokens + #prompt
    if o.cached then
        l.hit_tokens = l.hit_tokens + o.cached
        if o.cached > 0 then
            l.hits = l.hits + 1
        end
    end
end


-- observer() -> a function(prompt, out, info) for Tenants manager observers.
function Shadow:observer()
    return function(prompt, out, info)
        self:feed(prompt, out, { salt = info.salt, tenant = info.tid, cached = info.cached })
    end
end


function Shadow:report()
    local r = {}
    local l = self.live
    r.live = { lookups = l.lookups, hits = l.hits, hit_tokens = l.hit_tokens, prompt_tokens = l.prompt_tokens,
               hit_rate = l.prompt_tokens > 0 and l.hit_tokens / l.prompt_tokens or 0 }
    for name, s in pairs(self.sims) do
        r[name] = s:stats()
    end
    return r
end


function Shadow:format()
    local r = self:report()
    local lines = { string.format("%-10s %8s %10s %10s", "policy", "hit_rate", "hit_tokens", "evictions") }
    lines[2] = string.format("%-10s %8.3f %10d %10s", "live", r.live.hit_rate, r.live.hit_tokens, "-")
    for _, name in ipairs(self.names) do
        local s = r[name]
        lines[#lines + 1] = string.format("%-10s %8.3f %10d %10d", name, s.hit_rate, s.hit_tokens, s.evictions)
    end
    return table.concat(lines, "\n")
end


return _M
