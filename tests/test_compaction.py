from pyshim.text.compaction import compact, salient_lines


def words(messages):
    return sum(len(m["content"].split()) + 2 for m in messages)


def conversation(turns: int):
    msgs = [{"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "My project lives in /srv/app and uses port 8080."},
            {"role": "assistant", "content": "Understood."}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"filler question number {i} " + "blah " * 20})
        msgs.append({"role": "assistant", "content": "some answer " + "words " * 20})
    msgs.append({"role": "user", "content": "Which port again?"})
    return msgs


def test_fitting_conversations_are_untouched():
    msgs = conversation(2)
    out, compacted = compact(msgs, words, budget=10_000)
    assert out is msgs and not compacted


def test_long_conversation_keeps_system_first_exchange_recent_and_salient_lines():
    msgs = conversation(30)
    out, compacted = compact(msgs, words, budget=400)
    assert compacted and words(out) <= 400
    assert out[0] == msgs[0] and out[1] == msgs[1] and out[2] == msgs[2]
    assert out[-1]["content"] == "Which port again?"
    note = next(m for m in out if m["content"].startswith("[Earlier conversation compacted"))
    assert "filler question number 2" in note["content"]   # numbers are salient: the latest middle ones stay
    roles = [m["role"] for m in out[1:]]
    assert all(a != b for a, b in zip(roles, roles[1:])), roles   # turns still alternate


def test_salient_lines_pick_paths_numbers_and_identifiers():
    lines = salient_lines([{"role": "user", "content": "hello there\nsee src/main.py\ncall load_model()\nnothing here"}])
    assert lines == ["user: see src/main.py", "user: call load_model()"]


def test_a_single_huge_message_is_all_that_is_kept():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "x " * 1000}]
    out, compacted = compact(msgs, words, budget=50)
    assert compacted and out == msgs
