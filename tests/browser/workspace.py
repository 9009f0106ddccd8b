"""The workspace scenario (issue 68): on a session's page a file picked in
the Workspace card goes into /workspace, a turn's result says what it
changed and its Changes button shows the diff, and Download saves the
workspace. scenarios.py lists it; it is apart only to keep files short."""

import os
import tempfile

from scenarios import Failure, open_new_session, send_prompt, wait_result

EDIT = "$ sed -i 's/hello/hello, world/' /workspace/notes.txt && echo new > /workspace/added.txt"


def scenario_workspace(b, args):
    facts = {}
    sid = open_new_session(b)

    # In: a file picked in the card (the drop zone calls the same code).
    local = os.path.join(tempfile.mkdtemp(), "notes.txt")
    with open(local, "w") as f:
        f.write("hello\n")
    b.tid("workspace-card")
    b.tid("upload-input", visible=False).send_keys(local)
    note = b.wait(lambda: (lambda n: n if n.get_attribute("data-uploaded") == "1" else None)(b.tid("workspace-note")), 20,
                  "the upload to be done")
    facts["upload_note"] = note.text
    if "notes.txt" not in note.text or "/workspace" not in note.text:
        raise Failure(f"the card says {note.text!r} after the upload")

    # A turn that edits it and adds one: its result says so, and shows the diff.
    send_prompt(b, EDIT, via="enter")
    result = wait_result(b, 0, 60, "success")
    changed = b.wait(lambda: b.text('[data-testid="files-changed"]'), 10, "the result's files changed")
    facts["files_changed"] = changed[-1]
    if "+1 ~1 −0" not in changed[-1]:
        raise Failure(f"the result says {changed[-1]!r}; the turn added one file and modified one")
    b.click("show-changes")
    diff = b.wait(lambda: (lambda t: t if t and "added.txt" in t[0] else None)(b.text('[data-testid="diff"]')), 30, "the diff")
    facts["diff"] = diff[0]
    for line in ["+++ b/added.txt", "-hello", "+hello, world"]:
        if line not in diff[0]:
            raise Failure(f"the diff lacks {line!r}: {diff[0]!r}")
    b.shot("session-workspace")

    # Out: the whole workspace.
    b.click("download")
    note = b.wait(lambda: (lambda n: n if n.get_attribute("data-downloaded") else None)(b.tid("workspace-note")), 30,
                  "the download")
    facts["downloaded"] = int(note.get_attribute("data-downloaded"))
    facts.update(session=sid, result_seq=result["seq"])
    return facts
