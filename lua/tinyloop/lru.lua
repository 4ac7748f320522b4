-- tinyloop.lru - a map bounded to `cap` entries that drops the least
-- recently used one (O(1) get/set: a hash over a doubly linked list).
--
--   local lru = require "tinyloop.lru"
--   local t = lru.new(1024, function(key, value) release(value) end)
--   t:set("acme", v); t:get("acme")  -- get touches
--
-- on_evict(key, value) runs for an entry dropped to make room (not for
-- delete or an overwrite), after it left the map.
local setmetatable, type, error = setmetatable, type, error

local _M = {}
local mt = { __index = _M }


function _M.new(cap, on_evict)
    if type(cap) ~= "number" or cap < 1 or cap % 1 ~= 0 then
        error("lru.new: cap must be an integer >= 1, got " .. tostring(cap), 2)
    end
    -- head.next is the most recently used, head.prev the least
    local head = {}
    head.next, head.prev = head, head
    return setmetatable({ cap = cap, n = 0, map = {}, head = head, on_evict = on_evict }, mt)
end


local function unlink(node)
    node.prev.next = node.next
    node.next.prev = node.prev
end


local function push_front(head, node)
    node.next = head.next
    node.prev = head
    head.next.prev = node
    head.next = node
end


function _M:get(key)
    local node = self.map[key]
    if not node then
        return nil
    end
    unlink(node)
    push_front(self.head, node)
    return node.value
end


-- peek(key): the value without touching it.
function _M:peek(key)
    local node = self.map[key]
    return node and node.value
end


function _M:set(key, value)
    local node = self.map[key]
    if node then
        node.value = value
        unlink(node)
        push_front(self.head, node)
        return
    end
    node = { key = key, value = value }
    self.map[key] = node
    push_front(self.head, node)
    self.n = self.n + 1
    while self.n > self.cap do
        local old = self.head.prev
        unlink(old)
        self.map[old.key] = nil
        self.n = self.n - 1
        if self.on_evict then
            self.on_evict(old.key, old.value)
        end
    end
end


function _M:delete(key)
    local node = self.map[key]
    if node then
        unlink(node)
        self.map[key] = nil
        self.n = self.n - 1
    end
end


function _M:count()
    return self.n
end


return _M
